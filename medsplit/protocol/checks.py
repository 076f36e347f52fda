"""Checks of what a frame holds, made before anything in it is applied (invariant 5).

Decoding already checks a frame's form (:func:`medsplit.wire.decode_frame`); these check
its values against the job and the turn: finite numbers, labels in range, batch sizes,
steps within the turn, metrics that can be true. Every failure raises
:class:`FrameRejected`, which names the check, so the driver can fail the sender's turn
attempt with a reason a person can act on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from medsplit.errors import FrameError, ProtocolError
from medsplit.wire import Frame, FrameSpec, check_frame

# The checks, by the short name a refusal carries.
WELL_FORMED = "well-formed"
SHAPE = "shape"
BATCH = "batch size"
FINITE = "finite"
LABELS = "labels in range"
STEPS = "step limit"
METRICS = "metrics"
HANDSHAKE = "handshake"

CHECKS = (WELL_FORMED, SHAPE, BATCH, FINITE, LABELS, STEPS, METRICS, HANDSHAKE)


class FrameRejected(ProtocolError):
    """A frame failed a check; nothing in it was applied.

    Attributes:
        check: the check's short name (one of :data:`CHECKS`).
        problem: what was wrong, in words.
        kind, step: the refused frame's kind and step, when known.
        sender: who sent it (``"hospital 'general'"``, ``"the server"``), once a driver
            knows (:meth:`sent_by`).
    """

    def __init__(
        self,
        check: str,
        problem: str,
        *,
        kind: str | None = None,
        step: int | None = None,
        sender: str | None = None,
    ) -> None:
        self.check, self.problem = check, problem
        self.kind, self.step, self.sender = kind, step, sender
        super().__init__(self._describe())

    @classmethod
    def of(cls, frame: Frame, check: str, problem: str) -> FrameRejected:
        return cls(check, problem, kind=str(frame.meta.kind), step=frame.meta.step)

    def sent_by(self, sender: str) -> FrameRejected:
        """The same refusal, naming who sent the frame."""
        return FrameRejected(
            self.check, self.problem, kind=self.kind, step=self.step, sender=sender
        )

    def _describe(self) -> str:
        what = f"{self.kind} frame" if self.kind else "frame"
        if self.step is not None:
            what += f" for step {self.step}"
        whose = f"{self.sender}'s " if self.sender else ""
        return f"{whose}{what} failed the {self.check!r} check: {self.problem}"


@dataclass(frozen=True)
class FrameLimits:
    """What the job and the hospital's data allow one turn's frames to hold.

    Attributes:
        batch_size: the job's samples per step.
        exact_batch: every training batch holds exactly ``batch_size`` samples (the job
            drops a last short batch, ``drop_last``); else at most that many.
        num_classes: the job's classes; labels and logits are checked against it.
        train_steps: ``T``, the training steps of this turn, when known.
        val_samples: the hospital's validation samples, when known: ``V`` batches of
            at most ``batch_size`` follow training.
        label_shape: one sample's training target: ``()`` a class index
            (classification), ``(1, *spatial)`` a mask (segmentation,
            :func:`medsplit.training.tasks.label_shape`). Labels that travel must have
            it, and validation logits are ``(B, num_classes, *spatial)``.
        max_batch: the largest training batch when batches vary in size (Poisson
            sampling, activation noise: :func:`medsplit.defenses.accounting.poisson_bound`);
            ``None``: ``batch_size``.
    """

    batch_size: int
    exact_batch: bool = True
    num_classes: int | None = None
    train_steps: int | None = None
    val_samples: int | None = None
    label_shape: tuple[int, ...] = ()
    max_batch: int | None = None

    @property
    def largest_batch(self) -> int:
        """The most samples a training batch may hold."""
        return self.max_batch if self.max_batch is not None else self.batch_size

    def __post_init__(self) -> None:
        if self.max_batch is not None and (
            not isinstance(self.max_batch, int) or self.max_batch < self.batch_size
        ):
            raise ValueError(f"max_batch must be an integer >= batch_size, got {self.max_batch!r}")
        shape = self.label_shape
        if not isinstance(shape, tuple) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape
        ):
            raise ValueError(f"label_shape must be a tuple of sizes >= 1, got {shape!r}")
        least_of = {"batch_size": 1, "num_classes": 1, "train_steps": 0, "val_samples": 0}
        for name, least in least_of.items():
            value = getattr(self, name)
            if value is None and name != "batch_size":
                continue  # not known
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")

    @property
    def eval_steps(self) -> int | None:
        """``V``: validation batches after training, when the validation size is known."""
        if self.val_samples is None:
            return None
        return -(-self.val_samples // self.batch_size)

    @property
    def metrics_step(self) -> int | None:
        """``T + V``: the step that carries the metrics, when both are known."""
        if self.train_steps is None or self.eval_steps is None:
            return None
        return self.train_steps + self.eval_steps

    def eval_batch(self, index: int) -> int | None:
        """Samples in validation batch ``index`` (from 0), when the validation size is known."""
        if self.val_samples is None:
            return None
        return max(0, min(self.batch_size, self.val_samples - index * self.batch_size))


# -- form ---------------------------------------------------------------------------------


def conforms(frame: Frame, spec: FrameSpec) -> None:
    """The frame's kind, tensor names, dtypes and per-sample shapes are those of ``spec``."""
    try:
        check_frame(frame, spec)
    except FrameError as e:
        raise FrameRejected.of(frame, SHAPE, str(e)) from e


def batch_of(frame: Frame) -> int:
    """The one batch size every non-scalar tensor of the frame carries."""
    sizes = {name: int(t.shape[0]) for name, t in frame.tensors.items() if t.dim() > 0}
    if not sizes:
        raise FrameRejected.of(frame, BATCH, "no tensor carries a batch")
    if len(set(sizes.values())) > 1:
        raise FrameRejected.of(frame, BATCH, f"tensors disagree on the batch size: {sizes}")
    return next(iter(sizes.values()))


def check_batch(frame: Frame, expected: int) -> None:
    """Every non-scalar tensor carries ``expected`` samples (the receiver's own batch)."""
    for name, t in frame.tensors.items():
        if t.dim() > 0 and t.shape[0] != expected:
            raise FrameRejected.of(
                frame,
                BATCH,
                f"tensor {name!r} has batch size {t.shape[0]}, expected {expected} "
                "(the batch this step was started with)",
            )


def check_training_batch(frame: Frame, samples: int, limits: FrameLimits | None) -> None:
    """A training step's batch: at least one sample, and no more than the job allows."""
    if samples < 1:
        raise FrameRejected.of(frame, BATCH, "an empty batch cannot be trained on")
    if limits is None:
        return
    if limits.max_batch is not None:
        if samples > limits.max_batch:
            raise FrameRejected.of(
                frame,
                BATCH,
                f"a batch of {samples} samples; the job's Poisson sampling (activation noise) "
                f"draws at most {limits.max_batch} per step",
            )
        return
    if samples > limits.batch_size or (limits.exact_batch and samples != limits.batch_size):
        need = "exactly" if limits.exact_batch else "at most"
        raise FrameRejected.of(
            frame,
            BATCH,
            f"a batch of {samples} samples; the job trains on {need} {limits.batch_size} per step",
        )


def check_eval_batch(frame: Frame, samples: int, limits: FrameLimits | None, index: int) -> None:
    """A validation batch: ``index``'s size when the validation split's size is known."""
    if samples < 1:
        raise FrameRejected.of(frame, BATCH, "an empty validation batch")
    if limits is None:
        return
    want = limits.eval_batch(index)
    if samples > limits.batch_size or (want is not None and samples != want):
        need = f"{want}" if want is not None else f"at most {limits.batch_size}"
        raise FrameRejected.of(
            frame,
            BATCH,
            f"validation batch {index} holds {samples} samples; the hospital's reported "
            f"validation split gives it {need}",
        )


# -- values -------------------------------------------------------------------------------


def check_finite(frame: Frame, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
    """Every floating tensor of the frame (or of ``tensors``) holds finite numbers only."""
    for name, t in (frame.tensors if tensors is None else tensors).items():
        if t.dtype.is_floating_point and not _all_finite([t]):
            bad = int((~torch.isfinite(t)).sum())
            raise FrameRejected.of(
                frame,
                FINITE,
                f"tensor {name!r} holds {bad} non-finite value(s) (NaN or infinity) of "
                f"{t.numel()}: the sender's segment diverged or its input is corrupt",
            )


def check_labels(frame: Frame, labels: torch.Tensor, limits: FrameLimits | None) -> None:
    """Labels are class indices of the job, ``0 <= y < num_classes``, each of the job's
    label shape (a class per sample, or a mask of the input's spatial shape)."""
    if limits is None:
        return
    want = limits.label_shape
    if labels.dtype != torch.int64 or tuple(labels.shape[1:]) != want:
        form = f"(B, {', '.join(map(str, want))}) masks" if want else "(B,) class indices"
        raise FrameRejected.of(
            frame,
            LABELS,
            f"labels are {labels.dtype} {tuple(labels.shape)}; the job's are int64 {form}",
        )
    if limits.num_classes is None or not labels.numel():
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= limits.num_classes:
        raise FrameRejected.of(
            frame,
            LABELS,
            f"labels range over [{low}, {high}]; the job has classes 0..{limits.num_classes - 1} "
            "(check the hospital's labels against the job's num_classes)",
        )


def check_logits(frame: Frame, logits: torch.Tensor, samples: int, limits: FrameLimits) -> None:
    """Validation logits: ``num_classes`` floating values per sample (per pixel of the
    job's masks, for segmentation), all finite."""
    classes = limits.num_classes
    spatial = tuple(limits.label_shape[1:])
    if (
        not logits.dtype.is_floating_point
        or logits.dim() != 2 + len(spatial)
        or tuple(logits.shape[2:]) != spatial
        or (classes is not None and logits.shape[1] != classes)
    ):
        want = f"(B, {classes if classes is not None else 'classes'}"
        want += "".join(f", {d}" for d in spatial) + ")"
        raise FrameRejected.of(
            frame,
            SHAPE,
            f"logits are {logits.dtype} {tuple(logits.shape)}; expected a floating {want}",
        )
    if logits.shape[0] != samples:
        raise FrameRejected.of(
            frame,
            BATCH,
            f"logits for {logits.shape[0]} samples; the validation batch holds {samples}",
        )
    check_finite(frame, {"logits": logits})


def check_computed(
    frame: Frame,
    tensors: Mapping[str, torch.Tensor],
    parameters: Iterable[torch.nn.Parameter] = (),
) -> None:
    """What the receiver itself computed from ``frame`` (its loss, the gradients it would
    send, those of its own weights) is finite, before its optimizer steps.

    Finite but huge inputs can overflow on the way; the refusal names the frame that
    caused it, so the sender's attempt fails and these weights stay as they were.
    """
    for name, t in tensors.items():
        if t.dtype.is_floating_point and not _all_finite([t]):
            raise FrameRejected.of(
                frame,
                FINITE,
                f"computing on it gave a non-finite {name} (its values overflow); "
                "nothing was applied",
            )
    grads = [p.grad for p in parameters if p.grad is not None]
    if not _all_finite(grads):
        raise FrameRejected.of(
            frame,
            FINITE,
            "computing on it gave non-finite gradients of the receiver's weights "
            "(its values overflow); nothing was applied",
        )


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of ``tensors`` (floating) is finite.

    A finite sum means finite values (NaN and infinities propagate), and summing is far
    cheaper than ``isfinite`` over every weight's gradient at every step; only a tensor
    whose sum is not finite (maybe an overflow of finite values) is looked at in full.
    """
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return True
    sums = torch.stack([t.sum().float() for t in tensors])
    if bool(torch.isfinite(sums).all()):
        return True
    overflowed = [t for t, total in zip(tensors, sums, strict=True) if not total.isfinite()]
    return all(bool(torch.isfinite(t).all()) for t in overflowed)


# -- steps --------------------------------------------------------------------------------


def check_training_step(frame: Frame, limits: FrameLimits | None) -> None:
    """A training frame's step is one of the turn's ``T`` training steps."""
    if limits is None or limits.train_steps is None:
        return
    if frame.meta.step >= limits.train_steps:
        raise FrameRejected.of(
            frame,
            STEPS,
            f"step {frame.meta.step} is past the turn's {limits.train_steps} training steps "
            "(the job's epochs and max_steps_per_turn over the hospital's reported data)",
        )


def check_eval_step(frame: Frame, limits: FrameLimits | None) -> int | None:
    """A validation frame comes after all ``T`` training steps and within ``V`` batches;
    returns its batch index (from 0) when ``T`` is known."""
    if limits is None or limits.train_steps is None:
        return None
    step, train = frame.meta.step, limits.train_steps
    if step < train:
        raise FrameRejected.of(
            frame,
            STEPS,
            f"validation at step {step}, before the turn's {train} training steps are done",
        )
    index = step - train
    if limits.eval_steps is not None and index >= limits.eval_steps:
        raise FrameRejected.of(
            frame,
            STEPS,
            f"validation batch {index} is past the {limits.eval_steps} batches of the "
            "hospital's reported validation split",
        )
    return index


def check_metrics_step(frame: Frame, limits: FrameLimits | None) -> None:
    """The metrics come at step ``T + V``: a turn is not complete before its steps are."""
    if limits is None or limits.train_steps is None:
        return
    step, train, final = frame.meta.step, limits.train_steps, limits.metrics_step
    if step < train:
        raise FrameRejected.of(
            frame,
            STEPS,
            f"metrics at step {step} claim the turn complete after {step} of its {train} "
            "training steps",
        )
    if final is not None and step != final:
        raise FrameRejected.of(
            frame,
            STEPS,
            f"metrics at step {step}; after {train} training steps and {limits.eval_steps} "
            f"validation batches they belong at step {final}",
        )


# -- metrics ------------------------------------------------------------------------------


def check_metrics(frame: Frame, values: Mapping[str, float], limits: FrameLimits | None) -> None:
    """Metrics that can be true: losses finite and >= 0, accuracies, AUCs and Dice in [0, 1],
    sample counts whole, >= 0 and no more than the hospital's validation split."""
    for name, value in values.items():
        problem = _impossible(name, value, limits)
        if problem:
            raise FrameRejected.of(frame, METRICS, f"{name} = {value!r}: {problem}")


def _impossible(name: str, value: float, limits: FrameLimits | None) -> str:
    if not math.isfinite(value):
        return "not a finite number"
    if name.endswith("_loss") and value < 0:
        return "a loss cannot be negative"
    if name.endswith(("_accuracy", "_auc", "_dice")) and not 0.0 <= value <= 1.0:
        return "must lie in [0, 1]"
    if name.endswith("_samples"):
        if value < 0 or value != int(value):
            return "a count of samples is a whole number >= 0"
        if (
            name == "val_samples"
            and limits is not None
            and limits.val_samples is not None
            and value > limits.val_samples
        ):
            return f"more than the {limits.val_samples} validation samples the hospital reported"
    return ""
