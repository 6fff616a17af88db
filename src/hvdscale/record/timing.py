"""Per-epoch timing: the phase split of the training steps, and the Horovod timeline check.

How the split is measured (docs/timing.md has the details, what "sync" includes, and
the fault hook that validates the attribution to phases):

* Every training step runs inside one compiled ``tf.function`` (``steps_per_execution``
  steps per call, in a graph loop). In a *timed* call the step body carries
  ``tf.timestamp()`` ops with explicit control dependencies at the phase boundaries:
  data (batch gathered; the gap since the previous step's end, i.e. the loop overhead,
  belongs to it) | compute (forward + backward: loss and gradients ready) | sync
  (gradients allreduced; 0 on one worker, where Horovod skips the allreduce too) |
  update (optimizer applied: the updated weights are read back). On a GPU each boundary
  also reads one scalar of the phase's output on the host, which waits for the device.
  The phase durations are summed into a variable inside the graph, so timing costs no
  host round trip per step.
* ``time.perf_counter`` around each call gives the call's wall time; wall minus the
  in-graph time of the call is the host-side launch overhead (``time_dispatch_s``).
* Every ``instrument_every``-th call is timed; the others run the same step without the
  timestamp ops. Epoch totals are the timed steps' means x all steps of the epoch.
* Headline times (epoch ``wall_s``, throughput, ``elapsed_s`` and so time to target) come
  from the uninstrumented calls (issue 17): the timed calls' (and the Horovod-timeline
  calls') wall time is replaced by their steps at the uninstrumented calls' mean per-step
  time (``EpochTimer.headline_train_s``); ``wall_measured_s`` keeps the raw epoch time and
  ``timing.instrumentation`` the per-step medians of both kinds and the overhead.
* ``time_train_s`` is the wall time of the epoch's step loop; the four phases add up to
  it up to the launch overhead (``time_dispatch_s``) and the noise-scale sums of timed
  multi-worker steps, which are in no phase (plain steps do not compute them).
  ``time_other_s`` is the epoch wall time minus the four phases: launch overhead, test
  evaluation, metric reduction, the noise-scale sums.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

PHASES = ("data", "compute", "sync", "update")
#: a timed step's in-graph parts: the four phases, then the noise-scale sums of a timed
#: multi-worker update, which belong to no phase (plain steps do not compute them)
STEP_PARTS = (*PHASES, "noise")

TIMING_METHOD = (
    "in-graph tf.timestamp at phase boundaries inside the compiled step "
    "(data|compute|sync|update, explicit control dependencies, GPU: host read of a scalar "
    "per boundary); every instrument_every-th call timed, epoch totals = timed means x "
    "steps; launch overhead = perf_counter call wall - in-graph time; "
    "noise-scale sums of timed multi-worker steps in no phase; "
    "time_other_s = wall_s - sum of the four phases; headline wall_s/throughput/elapsed_s "
    "from uninstrumented calls (timed calls counted at the uninstrumented per-step time)"
)
#: the torch-ddp trainer's (hvdscale.trainer.torch_ddp.step): host clocks, not in-graph
TORCH_TIMING_METHOD = (
    "time.perf_counter at phase boundaries of the timed steps (data|compute|sync|update: "
    "the compute under DDP's no_sync, then one explicit allreduce of all gradients; GPU: "
    "torch.cuda.synchronize before each clock read); every instrument_every-th call timed, "
    "epoch totals = timed means x steps; noise-scale sums of timed multi-worker steps in no "
    "phase; time_other_s = wall_s - sum of the four phases; headline wall_s/throughput/"
    "elapsed_s from uninstrumented calls (plain DDP steps, the allreduce overlapping the "
    "backward pass; one synchronisation per call)"
)
#: framework -> its timing method (the run record's timing_method)
TIMING_METHODS = {"horovod-tf": TIMING_METHOD, "torch-ddp": TORCH_TIMING_METHOD}


@dataclass
class EpochTimer:
    """One epoch's step-loop timing (means over ranks once reduced)."""

    steps: int = 0  # optimizer steps (micro-batches) run this epoch
    timed_steps: int = 0  # steps that ran in timed calls
    phase_sums: list = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # over the timed steps
    dispatch_sum: float = 0.0  # launch overhead of the timed calls (call wall - in-graph time)
    train_wall: float = 0.0  # wall time of the whole step loop
    eval_wall: float = 0.0
    epoch_wall: float = 0.0
    # issue 17: the calls by kind (timed: instrumented; plain: uninstrumented; other:
    # calls under the Horovod timeline), their steps, wall times and per-step times
    plain_steps: int = 0
    plain_wall: float = 0.0
    timed_wall: float = 0.0
    other_steps: int = 0
    other_wall: float = 0.0
    plain_step_s: list = field(default_factory=list)  # per call: wall / steps
    timed_step_s: list = field(default_factory=list)

    def add_call(self, kind: str, n: int, wall: float) -> None:
        """One step-function call of ``n`` steps that took ``wall`` seconds."""
        if kind == "timed":
            self.timed_wall += wall
            self.timed_step_s.append(wall / n)
        elif kind == "plain":
            self.plain_steps += n
            self.plain_wall += wall
            self.plain_step_s.append(wall / n)
        else:
            self.other_steps += n
            self.other_wall += wall

    def headline_train_s(self, t_train: float) -> float:
        """The step loop's wall time as if every call had been uninstrumented: the
        timed (and timeline) calls' time replaced by their steps at the uninstrumented
        calls' mean per-step time. ``t_train`` itself when no call was uninstrumented."""
        if self.plain_steps == 0:
            return t_train
        rate = self.plain_wall / self.plain_steps
        other = self.timed_wall + self.other_wall
        return max(t_train - other + (self.timed_steps + self.other_steps) * rate, 1e-9)

    def instrumentation_fields(self) -> dict:
        """Per-epoch record fields: uninstrumented steps and the median per-step time of
        the uninstrumented and the instrumented calls (None without such calls)."""
        return {
            "plain_steps": self.plain_steps,
            "step_s_plain": _round(median(self.plain_step_s)),
            "step_s_timed": _round(median(self.timed_step_s)),
        }

    def totals(self) -> dict:
        """Epoch totals of the four phases and the launch overhead, in seconds."""
        if self.timed_steps == 0:
            return {
                "time_data_s": 0.0,
                "time_compute_s": 0.0,
                "time_sync_s": 0.0,
                "time_update_s": 0.0,
                "time_dispatch_s": 0.0,
            }
        scale = self.steps / self.timed_steps
        data, compute, sync, update = (max(0.0, float(s)) * scale for s in self.phase_sums)
        return {
            "time_data_s": data,
            "time_compute_s": compute,
            "time_sync_s": sync,
            "time_update_s": update,
            "time_dispatch_s": max(0.0, float(self.dispatch_sum)) * scale,
        }

    def record_fields(self) -> dict:
        t = self.totals()
        split = t["time_data_s"] + t["time_compute_s"] + t["time_sync_s"] + t["time_update_s"]
        out = {k: round(v, 6) for k, v in t.items()}
        out["time_train_s"] = round(self.train_wall, 6)
        out["time_eval_s"] = round(self.eval_wall, 6)
        out["time_other_s"] = round(self.epoch_wall - split, 6)
        out["timed_steps"] = self.timed_steps
        return out


def _round(x, nd: int = 9):
    return None if x is None else round(float(x), nd)


def instrumentation_block(epochs: list[dict], instrument_every: int) -> dict:
    """The record's ``timing.instrumentation`` (issue 17 item 2): step counts over all
    epochs; per-step times = medians over the non-warm-up epochs (all epochs when every
    epoch is warm-up) of each epoch's median per-call time; overhead = instrumented /
    uninstrumented - 1 (None when either is missing)."""
    timed = [e for e in epochs if not e["warmup"]] or list(epochs)
    plain = median([e.get("step_s_plain") for e in timed])
    inst = median([e.get("step_s_timed") for e in timed])
    return {
        "instrument_every": int(instrument_every),
        "instrumented_steps": int(sum(e.get("timed_steps", 0) for e in epochs)),
        "uninstrumented_steps": int(sum(e.get("plain_steps", 0) for e in epochs)),
        "uninstrumented_step_s": plain,
        "instrumented_step_s": inst,
        "overhead": _round(inst / plain - 1, 6) if plain and inst else None,
    }


SYNC_DEFINITIONS = {
    "horovod-tf": (
        "Horovod applies the averaged gradients after one grouped allreduce that starts "
        "when the backward pass has ended: nothing overlaps it, so the exposed "
        "synchronisation is the allreduce (the sync phase of the instrumented steps)"
    ),
    "torch-ddp": (
        "DDP overlaps each bucket's allreduce with the rest of the backward pass: "
        "allreduce_s is one separate allreduce of all gradients in the instrumented steps "
        "(the Horovod definition), comm_hook_s the time inside DDP's communication hook "
        "per plain step (sum over buckets, call to completed future), exposed_s the "
        "median plain step minus the median step without communication (the "
        "instrumented step's no_sync forward/backward + update, its sync phase left out)"
    ),
    "one-worker": "one worker: no gradient communication, nothing to synchronise",
}


def sync_block(epochs: list[dict], workers: int, framework: str, plain_step_s) -> dict:
    """The record's ``timing.sync`` (issue 19): per-step seconds, medians over the
    non-warm-up epochs (all epochs when every epoch is warm-up) of each epoch's value.
    ``allreduce_s`` = the sync phase per step (``time_sync_s / steps``); for torch-ddp
    ``comm_hook_s`` and ``no_comm_step_s`` from the epochs' ``comm_hook_step_s`` and
    ``step_s_no_comm`` (hvdscale.trainer.torch_ddp.step), ``exposed_s`` = ``plain_step_s`` (the
    median uninstrumented step) - ``no_comm_step_s``; for horovod-tf ``exposed_s`` =
    ``allreduce_s`` (no overlap). One worker: 0 for allreduce and exposed, null else."""
    if workers <= 1:
        return {
            "allreduce_s": 0.0,
            "comm_hook_s": None,
            "exposed_s": 0.0,
            "no_comm_step_s": None,
            "definition": SYNC_DEFINITIONS["one-worker"],
        }
    picked = [e for e in epochs if not e["warmup"]] or list(epochs)
    allreduce = median(
        [e["time_sync_s"] / e["steps"] for e in picked if e.get("timed_steps", 1) > 0]
    )
    if framework != "torch-ddp":
        return {
            "allreduce_s": _round(allreduce),
            "comm_hook_s": None,
            "exposed_s": _round(allreduce),
            "no_comm_step_s": None,
            "definition": SYNC_DEFINITIONS["horovod-tf"],
        }
    no_comm = median([e.get("step_s_no_comm") for e in picked])
    exposed = plain_step_s - no_comm if plain_step_s is not None and no_comm is not None else None
    return {
        "allreduce_s": _round(allreduce),
        "comm_hook_s": _round(median([e.get("comm_hook_step_s") for e in picked])),
        "exposed_s": _round(exposed),
        "no_comm_step_s": _round(no_comm),
        "definition": SYNC_DEFINITIONS["torch-ddp"],
    }


def split_error(epoch: dict) -> float:
    """Relative difference between the four phases and the step loop's wall time."""
    split = sum(epoch[f"time_{p}_s"] for p in PHASES)
    return abs(split - epoch["time_train_s"]) / epoch["time_train_s"]


# --------------------------------------------------------------------------- timeline


def _load_timeline_events(path: str | Path) -> list[dict]:
    """Events of a Horovod timeline (Chrome trace JSON; tolerates a file cut off mid-run)."""
    text = Path(path).read_text().strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        body = text.rstrip().rstrip(",")
        if not body.startswith("["):
            body = "[" + body
        # cut at the last complete event
        cut = body.rfind("}")
        data = json.loads(body[: cut + 1] + "]")
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def parse_timeline(path: str | Path, tensor_filter: str | None = None) -> dict:
    """Sum the ALLREDUCE activity of a Horovod timeline.

    Horovod writes one trace "process" per tensor with nested begin/end events:
    NEGOTIATE_ALLREDUCE (waiting until every rank has the tensor ready) and ALLREDUCE
    (the collective itself, with sub-activities such as MEMCPY_IN_FUSION_BUFFER and
    GLOO_ALLREDUCE / MPI_ALLREDUCE). Tensors of one fused group overlap in time, so
    the totals are the length of the *union* of the intervals (seconds): ``span_s``
    (negotiation start to allreduce end: everything Horovod's timeline sees),
    ``allreduce_s``, ``negotiate_s``; plus the plain per-tensor sum for reference.
    ``activities_s``: the same union for each activity nested in them (e.g.
    MPI_ALLREDUCE, MEMCPY_IN_FUSION_BUFFER), by name. ``tensor_filter``: only tensors
    whose name contains it.
    """
    events = _load_timeline_events(path)
    names: dict = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e.get("pid")] = str(e.get("args", {}).get("name", ""))
    stacks: dict = {}
    spans: dict[str, list[tuple[float, float]]] = {"ALLREDUCE": [], "NEGOTIATE_ALLREDUCE": []}
    whole: list[tuple[float, float]] = []  # negotiation start .. allreduce end, per tensor
    neg_start: dict = {}
    nested: dict[str, list[tuple[float, float]]] = {}
    per_tensor_sum = 0.0
    n_allreduce = 0
    for e in events:
        ph = e.get("ph")
        pid = e.get("pid")
        if tensor_filter and tensor_filter not in names.get(pid, ""):
            continue
        key = (pid, e.get("tid"))
        if ph == "B":
            st = stacks.setdefault(key, [])
            if not st and e.get("name") == "NEGOTIATE_ALLREDUCE":
                neg_start[key] = float(e.get("ts", 0))
            st.append((e.get("name"), float(e.get("ts", 0))))
        elif ph == "E":
            st = stacks.get(key)
            if not st:
                continue
            name, ts = st.pop()
            te = float(e.get("ts", 0))
            if st:  # nested activity: its own union; only top-level spans count below
                nested.setdefault(str(name), []).append((ts, te))
                continue
            if name in spans:
                spans[name].append((ts, te))
                if name == "ALLREDUCE":
                    per_tensor_sum += te - ts
                    n_allreduce += 1
                    whole.append((neg_start.pop(key, ts), te))
        elif ph == "X" and e.get("name") in spans and not stacks.get(key):
            ts = float(e.get("ts", 0))
            spans[e["name"]].append((ts, ts + float(e.get("dur", 0))))
    return {
        "span_s": _union_length(whole) / 1e6,
        "allreduce_s": _union_length(spans["ALLREDUCE"]) / 1e6,
        "negotiate_s": _union_length(spans["NEGOTIATE_ALLREDUCE"]) / 1e6,
        "allreduce_per_tensor_sum_s": per_tensor_sum / 1e6,
        "activities_s": {n: _union_length(iv) / 1e6 for n, iv in sorted(nested.items())},
        "allreduce_ops": n_allreduce,
        "tensors": sorted({n for p, n in names.items() if not tensor_filter or tensor_filter in n}),
    }


def timeline_check(
    path: str | Path | None, measured_sync_s: float, epochs: int, workers: int
) -> dict | None:
    """The run record's ``timeline_check``: rank 0's measured sync time over this
    attempt's epochs against the gradient allreduces in its Horovod timeline (None
    without a timeline or with one worker; ``{"error": ...}`` for an unreadable one).

    ``allreduce_to_sync_ratio`` = timeline ALLREDUCE time / measured sync time: the share
    of the sync phase in which the collective itself ran. Every ALLREDUCE activity of a
    step lies between that step's sync boundaries on rank 0, so the ratio is at most 1
    (with every call timed); the rest is the hand-over to and from Horovod's background
    thread and the wait for the slowest rank (negotiation). None when nothing was measured.
    """
    if path is None or not Path(path).is_file() or workers <= 1:
        return None
    try:
        tl = parse_timeline(path, tensor_filter="grads")
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    return {
        "timeline_span_s": round(tl["span_s"], 6),
        "timeline_allreduce_s": round(tl["allreduce_s"], 6),
        "timeline_negotiate_s": round(tl["negotiate_s"], 6),
        "timeline_allreduce_ops": tl["allreduce_ops"],
        "measured_sync_s_rank0": round(measured_sync_s, 6),
        "allreduce_to_sync_ratio": (
            round(tl["allreduce_s"] / measured_sync_s, 6) if measured_sync_s > 0 else None
        ),
        "epochs": epochs,
    }


def median(values) -> float | None:
    vals = sorted(
        v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))
    )
    if not vals:
        return None
    n = len(vals)
    mid = n // 2
    return vals[mid] if n % 2 else 0.5 * (vals[mid - 1] + vals[mid])
