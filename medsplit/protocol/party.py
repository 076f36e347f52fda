"""One party's share of the model: a segment with the optimizer and schedule that train it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LRScheduler

from medsplit.errors import HandoffError
from medsplit.protocol.optim import OptimizerConfig, build_optimizer, build_scheduler

_WEIGHT = "weight/"
_OPTIM = "optim/"


@dataclass
class Party:
    """A segment with the optimizer and schedule that train it.

    Build one with :meth:`create`. ``medsplit.protocol.handoff`` moves a party's whole
    training state (weights, buffers, optimizer state, schedule position) to the next
    hospital, so a round-robin job continues exactly where the last turn ended.
    """

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler | None
    config: OptimizerConfig

    @classmethod
    def create(cls, module: torch.nn.Module, config: OptimizerConfig) -> Party:
        """Wrap ``module`` with a fresh optimizer and schedule built from ``config``."""
        optimizer = build_optimizer(module.parameters(), config)
        return cls(module, optimizer, build_scheduler(optimizer, config), config)

    def step(self) -> None:
        """Apply the accumulated gradients, advance the schedule and clear the gradients."""
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def export_state(self, prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Training state as tensors and string metadata, every key under ``prefix``.

        Tensors come back on the CPU (safetensors stores CPU tensors), wherever the party
        trains; importing moves them to the party's device again.
        """
        names = self._param_names()
        tensors = {
            f"{prefix}{_WEIGHT}{k}": v.detach().to("cpu").contiguous()
            for k, v in self.module.state_dict().items()
        }
        optim_state = self.optimizer.state_dict()
        scalars: dict[str, dict[str, object]] = {}
        for index, state in optim_state["state"].items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"{prefix}{_OPTIM}{names[index]}/{key}"] = (
                        value.detach().to("cpu").contiguous()
                    )
                else:
                    scalars.setdefault(names[index], {})[key] = value
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [names[i] for i in g["params"]],
            }
            for g in optim_state["param_groups"]
        ]
        metadata = {
            f"{prefix}optimizer": self.config.name,
            f"{prefix}param_groups": json.dumps(groups),
            f"{prefix}scalar_state": json.dumps(scalars),
            f"{prefix}scheduler": json.dumps(
                self.scheduler.state_dict() if self.scheduler else None
            ),
        }
        return tensors, metadata

    def prepare_import(
        self, tensors: dict[str, torch.Tensor], metadata: dict[str, str], prefix: str
    ) -> Callable[[], None]:
        """Check that exported state fits this party; return the function that loads it.

        Checking everything before changing anything means a bad hand-off leaves the
        party exactly as it was.

        Raises:
            HandoffError: a missing, unexpected or ill-shaped tensor, or malformed metadata.
        """
        if metadata.get(f"{prefix}optimizer") != self.config.name:
            raise HandoffError(
                f"hand-off carries {metadata.get(f'{prefix}optimizer')!r} optimizer state for "
                f"{prefix!r} but this party uses {self.config.name!r}"
            )
        mine = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        weights = {k[len(_WEIGHT) :]: v for k, v in mine.items() if k.startswith(_WEIGHT)}
        _check_matches(weights, self.module.state_dict(), prefix)
        try:
            optim_state = self._optimizer_state(
                {k[len(_OPTIM) :]: v for k, v in mine.items() if k.startswith(_OPTIM)},
                json.loads(metadata[f"{prefix}scalar_state"]),
                json.loads(metadata[f"{prefix}param_groups"]),
            )
            scheduler_state = json.loads(metadata[f"{prefix}scheduler"])
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise HandoffError(f"hand-off state for {prefix!r} is malformed: {e!r}") from e
        if (scheduler_state is None) != (self.scheduler is None):
            raise HandoffError(
                f"hand-off and this party disagree on having a learning-rate schedule ({prefix!r})"
            )

        def apply() -> None:
            self.module.load_state_dict(weights, strict=True)
            self.optimizer.load_state_dict(optim_state)
            if self.scheduler is not None:
                self.scheduler.load_state_dict(scheduler_state)

        return apply

    def _param_names(self) -> dict[int, str]:
        """Optimizer state-dict indices to parameter names (indices follow group order)."""
        name_of = {id(p): n for n, p in self.module.named_parameters()}
        flat = [p for group in self.optimizer.param_groups for p in group["params"]]
        return {i: name_of[id(p)] for i, p in enumerate(flat)}

    def _optimizer_state(
        self,
        slots: dict[str, torch.Tensor],
        scalars: dict[str, dict[str, object]],
        groups: list[dict[str, object]],
    ) -> dict[str, object]:
        index_of = {name: i for i, name in self._param_names().items()}
        params = dict(self.module.named_parameters())
        state: dict[int, dict[str, object]] = {}
        for key, value in slots.items():
            name, _, slot = key.rpartition("/")
            if name not in index_of:
                raise HandoffError(f"hand-off has optimizer state for unknown parameter {name!r}")
            if slot != "step" and value.shape != params[name].shape:
                raise HandoffError(
                    f"optimizer state {slot!r} of {name!r} has shape {list(value.shape)}, "
                    f"expected {list(params[name].shape)}"
                )
            state.setdefault(index_of[name], {})[slot] = value
        for name, values in scalars.items():
            if name not in index_of:
                raise HandoffError(f"hand-off has optimizer state for unknown parameter {name!r}")
            state.setdefault(index_of[name], {}).update(values)
        if len(groups) != len(self.optimizer.param_groups):
            raise HandoffError(
                f"hand-off has {len(groups)} optimizer parameter groups, "
                f"expected {len(self.optimizer.param_groups)}"
            )
        for group, own in zip(groups, self.optimizer.param_groups, strict=True):
            names = group["params"]
            if not isinstance(names, list) or len(names) != len(own["params"]):
                raise HandoffError("hand-off optimizer groups do not match this segment")
            unknown = [n for n in names if n not in index_of]
            if unknown:
                raise HandoffError(f"hand-off optimizer names unknown parameters {unknown[:3]}")
            group["params"] = [index_of[n] for n in names]
            if "betas" in group:
                group["betas"] = tuple(group["betas"])  # type: ignore[arg-type]
        return {"state": state, "param_groups": groups}


def _check_matches(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], prefix: str
) -> None:
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    if missing or unexpected:
        raise HandoffError(
            f"hand-off does not fit segment {prefix!r}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]} (was it made for another model or cut?)"
        )
    for name in sorted(got):  # sorted, so the same mismatch is reported every time
        tensor, want = got[name], expected[name]
        if tensor.shape != want.shape or tensor.dtype != want.dtype:
            raise HandoffError(
                f"hand-off tensor {name!r} is {tensor.dtype} {list(tensor.shape)}, "
                f"expected {want.dtype} {list(want.shape)}"
            )
