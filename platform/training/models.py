"""Jobs, their participants, rounds, turns, metric points and hand-offs.

Rows here are written only by :mod:`training.services` and read through
:mod:`training.selectors`. None of them ever holds patient data, tensors or weights:
only configuration, counters, sizes and hashes.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from medsplit.modes import DEFAULT_MODE
from medsplit.training.config import TrainingConfig
from medsplit.training.description import JobDescription
from training.states import JobState


class OnFailure(models.TextChoices):
    """What the scheduler does when a turn fails."""

    RETRY = "retry"  # run the turn again, up to max_retries more times, then fail the job
    SKIP = "skip"  # mark the turn skipped and go on with the next hospital
    FAIL = "fail"  # fail the job at once


class Job(models.Model):
    """One training run of a registry model across an ordered list of hospitals."""

    name = models.CharField(max_length=200, blank=True)
    # What the job trains and how: medsplit's JobDescription in its versioned JSON form
    # (medsplit/training/description.py), written once when the job is created, served
    # as it is (the job's detail, the assignment) and read back by workers and agents.
    description = models.JSONField()
    # Copied from the description when the job is created, for the queries that filter,
    # list or schedule on them; nothing else reads them.
    model_name = models.CharField(max_length=200, db_index=True)
    mode = models.CharField(max_length=16, default=DEFAULT_MODE)
    rounds = models.PositiveIntegerField(default=1)
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices, default=OnFailure.RETRY)
    max_retries = models.PositiveSmallIntegerField(default=2)
    # How long a parallel group (a SplitFed round) may take, from its start, and then its
    # secure aggregation, from its opening: a straggler past it is left to on_failure.
    round_deadline_seconds = models.PositiveIntegerField(default=3600)

    state = models.CharField(
        max_length=16, choices=JobState.choices, default=JobState.DRAFT, db_index=True
    )
    state_reason = models.TextField(blank=True)
    # When state_reason tells one hospital's failure (its turn's reason), that hospital,
    # and what every other participant sees instead (kernel.permissions: least privilege).
    state_reason_hospital = models.ForeignKey(
        "hospitals.Hospital", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state_reason_shared = models.TextField(blank=True)
    state_changed_at = models.DateTimeField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Denormalised by the runtime services so the status endpoint is one indexed read.
    current_round = models.PositiveIntegerField(null=True, blank=True)
    current_turn = models.ForeignKey(
        "Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The server's weights where the last completed turn left them (None: as initialised).
    server_checkpoint = models.ForeignKey(
        "ServerCheckpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    hospitals = models.ManyToManyField(
        "hospitals.Hospital", through="JobParticipant", related_name="jobs"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.model_name}, {self.state})"

    def job_description(self) -> JobDescription:
        """The stored description, checked (:class:`JobDescriptionError` if it is not one
        this code reads)."""
        return JobDescription.from_json(self.description)

    def training_config(self) -> TrainingConfig:
        """The medsplit configuration workers and agents train this job with."""
        return self.job_description().training_config(f"job-{self.pk}")


class JobParticipant(models.Model):
    """A hospital taking part in a job, at its place in the turn order."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="participants")
    hospital = models.ForeignKey(
        "hospitals.Hospital", on_delete=models.PROTECT, related_name="job_participations"
    )
    position = models.PositiveSmallIntegerField()
    # Vertical mode (later): which features of the shared patients this party holds.
    feature_set = models.CharField(max_length=64, blank=True)
    # The hospital's per-job HPKE recipient key (ML-KEM-768 + X25519, 1,216 bytes, base64)
    # and its ML-DSA-65 signature by the hospital's identity key (3,309 bytes, base64), as
    # its agent published them; the private key never leaves the agent, which deletes it
    # once the job has ended. ``recipient_key_generation`` is the identity generation that
    # signed it: a key signed by an identity replaced since is not handed out.
    recipient_key = models.TextField(blank=True)
    recipient_key_signature = models.TextField(blank=True)
    recipient_key_sha256 = models.CharField(max_length=64, blank=True)
    recipient_key_generation = models.PositiveIntegerField(default=0)
    recipient_key_published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["job", "position"], name="participant_position"),
            models.UniqueConstraint(fields=["job", "hospital"], name="participant_once"),
        ]

    def __str__(self) -> str:
        return f"{self.hospital} at {self.position} in job {self.job_id}"


class Round(models.Model):
    """Every participant taking one turn, group by group as the job's mode plans it."""

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="round_set")
    index = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="round_once")]

    def __str__(self) -> str:
        return f"round {self.index} of job {self.job_id}"


class Turn(models.Model):
    """One hospital training over its local data once; a retry is a new row (attempt + 1).

    The counters are cumulative over the turn and only ever grow.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        SKIPPED = "skipped"

    # Denormalised from round.job: jobs' turns are read far more often than written.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="turns")
    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="turns")
    hospital = models.ForeignKey(
        "hospitals.Hospital", on_delete=models.PROTECT, related_name="turns"
    )
    position = models.PositiveSmallIntegerField()
    # Its group in the round's plan (the job mode's plan_round): the turns of one group
    # run at the same time, a group starts once the one before it ended. Round-robin: one
    # turn per group, group == position. A retry keeps its turn's group.
    group = models.PositiveSmallIntegerField(default=0)
    attempt = models.PositiveSmallIntegerField(default=1)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    steps = models.PositiveIntegerField(default=0)
    samples = models.PositiveBigIntegerField(default=0)
    bytes_up = models.PositiveBigIntegerField(default=0)
    bytes_down = models.PositiveBigIntegerField(default=0)
    last_loss = models.FloatField(null=True, blank=True)
    # Validation metrics reported at the end of the turn, e.g. {"val_accuracy": 0.91}.
    metrics = models.JSONField(default=dict, blank=True)
    failure_reason = models.TextField(blank=True)
    # Which worker runs the turn's server side, and until when it holds it: a runner that
    # stops renewing (killed) loses the turn to the next one the scheduler sends.
    runner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["round", "position", "attempt"], name="turn_attempt_once"
            )
        ]
        indexes = [
            models.Index(fields=["job", "status"], name="turn_job_status"),
            models.Index(fields=["hospital", "status"], name="turn_hospital_status"),
        ]

    def __str__(self) -> str:
        return f"turn {self.pk} (job {self.job_id}, position {self.position}, {self.status})"


class MetricPoint(models.Model):
    """The progress of a turn at one moment; stored at a bounded rate (see services)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_points")
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    time = models.DateTimeField()
    # None when the reported loss was not finite (a diverging run).
    loss = models.FloatField(null=True, blank=True)
    samples = models.PositiveBigIntegerField(default=0)
    bytes_up = models.PositiveBigIntegerField(default=0)
    bytes_down = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["time", "id"]
        indexes = [
            models.Index(fields=["turn", "step"], name="metric_turn_step"),
            models.Index(fields=["job", "time"], name="metric_job_time"),
        ]


class HandOff(models.Model):
    """Metadata of the weights a hospital handed on after a turn, to one recipient.

    After each completed turn the hospital seals its weights for every other participant
    (HPKE to each one's per-job key, signed with its identity key, one blob each), so
    whoever takes the next turn, even after a skipped hospital, and every participant at
    the end of the job, can read them. Only the size and the SHA-256 of each ciphertext
    are kept; the blobs travel through the relay and neither they nor anything in clear is
    ever stored here. The hash lets the recipient and an auditor check that what arrived
    is what was sent.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="handoffs")
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="handoffs")
    sender = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    recipient = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    ciphertext_sha256 = models.CharField(max_length=64)
    size_bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["turn", "recipient"], name="handoff_once_per_recipient")
        ]


class ServerCheckpoint(models.Model):
    """The server segment's training state after one step of a turn, as a file.

    The file (safetensors: weights, optimizer state, schedule) lies under
    ``MEDSPLIT["CHECKPOINT_DIR"]`` at ``path``; ``sha256`` is checked on every load. A
    checkpoint belongs to a turn's place in the job (round and position), not to one
    attempt: a retried turn may continue from where the failed attempt's checkpoint left
    it, since the steps of a place are the same in every attempt. Server weights only:
    no hospital's weights or data are ever kept here.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="server_checkpoints")
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="server_checkpoints")
    round_index = models.PositiveIntegerField()
    position = models.PositiveSmallIntegerField()
    # The last step the state has applied (steps count from 0 within the turn).
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64)
    size_bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["round_index", "position", "step"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_index", "position", "step"], name="checkpoint_once"
            )
        ]

    def __str__(self) -> str:
        return (
            f"checkpoint of job {self.job_id} round {self.round_index} "
            f"position {self.position} after step {self.step}"
        )


class Aggregation(models.Model):
    """One attempt of the secure aggregation of a parallel group's hospital segments.

    Opened once every turn of a group of a secure-aggregation mode (SplitFed) ended, with
    the hospitals whose turns completed and their public weights (training samples). Each
    hospital puts its masked vector on the relay and reports its SHA-256 and size here,
    with its integer buffers (batch counts, public); once all have, a worker sums the
    vectors (never seeing one unmasked) and puts the aggregate on the relay. A hospital
    that drops, or whose submission is refused, is left out by a new attempt (fresh seeds)
    or fails the job, as ``Job.on_failure`` says. Sizes, hashes and counts only: no
    vector is ever stored here.
    """

    class Status(models.TextChoices):
        COLLECTING = "collecting"  # waiting for every participant's masked submission
        SUMMING = "summing"  # a worker sums them
        DONE = "done"  # the aggregate is on the relay
        RESTARTED = "restarted"  # replaced by the next attempt
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="aggregations")
    round_index = models.PositiveIntegerField()
    group = models.PositiveSmallIntegerField(default=0)
    attempt = models.PositiveSmallIntegerField(default=0)
    # {hospital slug: its number of training samples}: the round's public weights.
    weights = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COLLECTING)
    # {hospital slug: {"sha256", "size_bytes", "counts", "at"}}, as each reported.
    submissions = models.JSONField(default=dict, blank=True)
    aggregate_sha256 = models.CharField(max_length=64, blank=True)
    aggregate_size_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # The hospitals the attempt before this one had and this one left out, and why.
    dropped = models.JSONField(default=list, blank=True)
    failure_reason = models.TextField(blank=True)
    created_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["round_index", "group", "attempt"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_index", "group", "attempt"], name="aggregation_attempt_once"
            )
        ]

    def __str__(self) -> str:
        return (
            f"aggregation of job {self.job_id} round {self.round_index} attempt "
            f"{self.attempt} ({self.status})"
        )


class JobAlignment(models.Model):
    """A vertical job's record alignment as its parties reported it: each participant's
    digest and size of the intersection it holds, and the outcome of comparing them once
    all have (``training/alignment.py``). Digests and sizes only: no identifier ever
    reaches the coordinator.
    """

    class Status(models.TextChoices):
        PENDING = "pending"  # not every participant has reported yet
        AGREED = "agreed"  # every digest is the label party's: training may start
        MISMATCH = "mismatch"  # the parties hold different intersections: the job failed
        TOO_SMALL = "too_small"  # below the job's minimum: the job failed

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="alignment")
    # The smallest intersection the job trains on (its mode's min_records).
    minimum = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # The intersection's size: once agreed, or as the label party reported it too small.
    size = models.PositiveIntegerField(null=True, blank=True)
    # {hospital slug: {"digest", "size", "at"}}, as each reported.
    reports = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"alignment of job {self.job_id} ({self.status})"


class LabelLeakage(models.Model):
    """A vertical job's label-leakage audit of one round and one passive party, as the
    label party reported it (``training/leakage.py``): how well the norm and the cosine
    attacks (Li et al., ICLR 2022) guess the labels from the gradients that party
    received. Four numbers; no score, gradient or label reaches the coordinator."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="label_leakage")
    round_index = models.PositiveIntegerField()
    # The passive party whose received gradients were scored.
    hospital = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    records = models.PositiveIntegerField()
    # ROC AUC of each attack's scores against the labels; null where the labels are not
    # binary with both classes present (the attacks are defined for binary labels).
    norm_auc = models.FloatField(null=True, blank=True)
    cosine_auc = models.FloatField(null=True, blank=True)
    reported_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_index", "hospital"], name="one_leakage_per_round_and_party"
            )
        ]
        ordering = ["round_index", "hospital_id"]

    def __str__(self) -> str:
        return f"label leakage of job {self.job_id} round {self.round_index}"


class Evaluation(models.Model):
    """One evaluation of a completed job's final model at every participant: each
    hospital with a local test set scores it there, through the split (its front, and in
    U-shaped mode its head, at home; the server segment on a worker), in an
    evaluation-only turn (``medsplit/turns/evaluation.py``). Started when the job
    completes, and again on a consortium admin's request (a new attempt). Figures only:
    no prediction, logit or label ever reaches the coordinator.
    """

    class Status(models.TextChoices):
        RUNNING = "running"  # some hospital's evaluation has not ended yet
        COMPLETED = "completed"  # every hospital's ended (completed, failed, no test set)

    class Purpose(models.TextChoices):
        EVALUATION = "evaluation"
        # A vertical job's prediction asked for by its label party: the same joint pass
        # over the records it named (``training/vertical_prediction.py``), no figures.
        PREDICTION = "prediction"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="evaluations")
    attempt = models.PositiveSmallIntegerField(default=1)
    purpose = models.CharField(max_length=16, choices=Purpose.choices, default=Purpose.EVALUATION)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="evaluation_attempt_once")
        ]

    def __str__(self) -> str:
        return f"evaluation {self.attempt} of job {self.job_id} ({self.status})"


class HospitalEvaluation(models.Model):
    """One hospital's part of an :class:`Evaluation`: its evaluation-only turn, and the
    figures it measured on its test set (``metrics``: ``accuracy``, ``auc`` and
    ``baseline_accuracy`` for classification, ``dice`` for segmentation, ``samples``)."""

    class Status(models.TextChoices):
        RUNNING = "running"  # a worker serves it (or will), the agent takes part
        COMPLETED = "completed"
        FAILED = "failed"
        NO_TEST_SET = "no_test_set"  # the hospital reported no test set: nothing to run

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="parts")
    # Denormalised from evaluation.job: the agent's assignments read them by job.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="hospital_evaluations")
    hospital = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # The test set's size as the hospital reported it when the evaluation started (its
    # heartbeat's split_sizes["test"]): what its frames are checked against.
    test_samples = models.PositiveIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True)
    failure_reason = models.TextField(blank=True)
    bytes_up = models.PositiveBigIntegerField(default=0)
    bytes_down = models.PositiveBigIntegerField(default=0)
    # Which worker serves its server side, until when (as Turn's lease).
    runner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["evaluation_id", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["evaluation", "hospital"], name="hospital_evaluation_once"
            )
        ]
        indexes = [models.Index(fields=["status"], name="hospital_evaluation_status")]

    def __str__(self) -> str:
        return f"evaluation of job {self.job_id} at {self.hospital_id} ({self.status})"


class PrivacyFigures(models.Model):
    """What one hospital measured of its own exposure in one round of a job, as its agent
    reported it (``training/privacy.py``): how well its activations can be inverted
    (SSIM, PSNR), how dependent they are on its inputs (distance correlation), how well
    its gradients give its labels away (norm and cosine attacks' AUC, where labels stay at
    the hospital) and the ε its activation noise has spent so far. Numbers only: no image,
    activation, gradient or label reaches the coordinator (invariant 7)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="privacy_figures")
    round_index = models.PositiveIntegerField()
    hospital = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    # The inversion audit (null in a round the audit did not run): mean SSIM and PSNR (dB)
    # of the validation images rebuilt from their activations, and the same for the
    # training images' mean (what an attacker gets if the activations tell it nothing).
    ssim = models.FloatField(null=True, blank=True)
    psnr = models.FloatField(null=True, blank=True)
    baseline_ssim = models.FloatField(null=True, blank=True)
    baseline_psnr = models.FloatField(null=True, blank=True)
    distance_correlation = models.FloatField(null=True, blank=True)
    # Training records the decoder learnt from, validation records rebuilt.
    train_records = models.PositiveIntegerField(null=True, blank=True)
    val_records = models.PositiveIntegerField(null=True, blank=True)
    # Label leakage through the gradients it sent up (labels at the hospital, binary).
    label_records = models.PositiveIntegerField(null=True, blank=True)
    norm_auc = models.FloatField(null=True, blank=True)
    cosine_auc = models.FloatField(null=True, blank=True)
    # The activation noise's accounting (opacus' RDP accountant): ε spent so far, over
    # the whole job to this round, the δ it holds at with the Poisson redraws' share
    # added, and the noise multiplier in use (found from the target ε, if one was set).
    epsilon = models.FloatField(null=True, blank=True)
    delta_total = models.FloatField(null=True, blank=True)
    noise_multiplier = models.FloatField(null=True, blank=True)
    reported_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_index", "hospital"], name="one_privacy_report_per_round"
            )
        ]
        ordering = ["round_index", "hospital_id"]

    def __str__(self) -> str:
        return f"privacy figures of job {self.job_id} round {self.round_index}"


class InferenceRequest(models.Model):
    """One hospital's request for predictions of a completed job's final model through
    the split (``training/inference.py``): its images' activations go up the job's
    ``infer`` stream pair, a worker's server segment answers them. Counts and sizes only:
    no image, activation or prediction is kept here."""

    class Status(models.TextChoices):
        PENDING = "pending"  # accepted, not yet taken by a worker
        RUNNING = "running"  # a worker serves it
        COMPLETED = "completed"
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="inference_requests")
    hospital = models.ForeignKey("hospitals.Hospital", on_delete=models.PROTECT, related_name="+")
    position = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # What the hospital said it would send: images, in batches of at most serving_batch.
    samples = models.PositiveIntegerField()
    serving_batch = models.PositiveIntegerField()
    batches_served = models.PositiveIntegerField(default=0)
    bytes_up = models.PositiveBigIntegerField(default=0)
    bytes_down = models.PositiveBigIntegerField(default=0)
    failure_reason = models.TextField(blank=True)
    runner = models.CharField(max_length=200, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["status"], name="inference_request_status")]

    def __str__(self) -> str:
        return f"inference {self.pk} of job {self.job_id} at {self.hospital_id} ({self.status})"
