"""DeepSpeed's pipeline schedule as its PipelineEngine runs it: dsorch's own model of the
instruction stream of each stage and of the order in which the stages wait for each other.

The stream (deepspeed/runtime/pipe/schedule.py TrainSchedule.steps, DeepSpeed 0.19): a batch of
``m`` micro-batches on ``p`` stages is ``2 (m + p - 1)`` steps. At step ``t`` stage ``s`` runs the
forward of micro-batch ``(t - s) / 2`` when ``t`` and ``s`` have the same parity, else the
backward of micro-batch ``(t + s + 1) / 2 - p`` (where those are valid). A forward step first sends
the gradient of the previous step's micro-batch back (SendGrad) and receives this one's activation
(RecvActivation); a backward step first receives this one's gradient (RecvGrad) and sends the
previous step's activation on (SendActivation). The first and the last stage load their
micro-batch before each forward (LoadMicroBatch). The last step ends with ReduceTiedGrads,
ReduceGrads and OptimizerStep.

What waits for what (engine.py ``_INSTRUCTION_MAP``, p2p.py):

* every instruction runs to its end before the next starts (``_exec_schedule`` calls them in
  turn on the host; p2p.send/recv are ``dist.send``/``dist.recv``, which wait);
* a send and its receive meet: both end ``p2p`` seconds after the later of the two is posted
  (NCCL's and gloo's point-to-point are rendezvous: the sender needs the receiver's buffer);
* the k-th SendActivation of stage ``s`` meets the k-th RecvActivation of stage ``s + 1``, the
  k-th SendGrad of ``s + 1`` the k-th RecvGrad of ``s``;
* after the flush, ReduceTiedGrads all-reduces the tied embedding's gradient between the stages
  that hold it (the first and the last): the one that finished first waits for the other;
  ReduceGrads all-reduces each stage's gradients over its data-parallel group, nothing of it
  overlapped (the pipeline engine turns ``enable_backward_allreduce`` off); OptimizerStep takes
  the gradient norm over the model-parallel group (all stages), and ``train_batch`` ends by
  broadcasting the loss from the last stage (``_aggregate_total_loss``): the batch ends for every
  stage when the slowest one does.

Because a forward step of stage ``s`` starts with the exchange with stage ``s - 1`` that the
latter posts at the start of the same step, neighbouring stages start every step together, and
in the steady state even and odd stages run opposite passes in the same step: a step lasts the
longer of the forward and the backward, not their mean (``closed_form``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SendActivation", "RecvActivation", "SendGrad", "RecvGrad"
LOAD, FORWARD, BACKWARD = "LoadMicroBatch", "ForwardPass", "BackwardPass"
TIED, REDUCE, OPTIMIZER = "ReduceTiedGrads", "ReduceGrads", "OptimizerStep"
P2P = (SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD)
# The peer of each p2p instruction (stage offset) and the instruction it meets there.
PEER = {SEND_ACT: (1, RECV_ACT), RECV_ACT: (-1, SEND_ACT), SEND_GRAD: (-1, RECV_GRAD), RECV_GRAD: (1, SEND_GRAD)}


@dataclass(frozen=True)
class Instr:
    name: str
    micro_batch: int  # -1 for the instructions of the whole batch
    step: int


def _micro_batch(t: int, s: int, p: int) -> tuple[int, bool]:
    """Micro-batch and direction of step ``t`` on stage ``s``: forward when parities agree."""
    if (t - s) % 2 == 0:
        return (t - s) // 2, True
    return (t + s + 1) // 2 - p, False


def stream(stage: int, stages: int, micro_batches: int) -> list[Instr]:
    """The instructions stage ``stage`` executes for one batch, in order (buffers omitted: the
    micro-batch identifies them)."""
    p, m, s = stages, micro_batches, stage
    out: list[Instr] = []
    prev = -1
    steps = 2 * (m + p - 1)
    for t in range(steps):
        mb, fwd = _micro_batch(t, s, p)
        ok, prev_ok = 0 <= mb < m, 0 <= prev < m
        if fwd:
            if prev_ok and s > 0:
                out.append(Instr(SEND_GRAD, prev, t))
            if ok and s > 0:
                out.append(Instr(RECV_ACT, mb, t))
            if ok and s in (0, p - 1):
                out.append(Instr(LOAD, mb, t))
            if ok:
                out.append(Instr(FORWARD, mb, t))
        else:
            if ok and s < p - 1:
                out.append(Instr(RECV_GRAD, mb, t))
            if prev_ok and s < p - 1:
                out.append(Instr(SEND_ACT, prev, t))
            if ok:
                out.append(Instr(BACKWARD, mb, t))
        if t == steps - 1:
            out += [Instr(TIED, -1, t), Instr(REDUCE, -1, t), Instr(OPTIMIZER, -1, t)]
        prev = mb
    return out


@dataclass(frozen=True)
class Durations:
    """Seconds of each instruction on each stage (arrays of length ``stages``, or scalars): what it
    takes when nothing waits. ``p2p`` is one transfer between neighbours; ``tied`` the tied
    embedding's all-reduce (0 where a stage holds none); ``finish`` what follows the optimizer
    step on every stage (the loss broadcast)."""

    forward: object
    backward: object
    p2p: object = 0.0
    load: object = 0.0
    tied: object = 0.0
    reduce: object = 0.0
    optimizer: object = 0.0
    finish: float = 0.0

    def of(self, name: str, stage: int) -> float:
        key = {
            FORWARD: "forward",
            BACKWARD: "backward",
            LOAD: "load",
            TIED: "tied",
            REDUCE: "reduce",
            OPTIMIZER: "optimizer",
        }.get(name, "p2p")
        v = np.asarray(getattr(self, key), dtype=float)
        return float(v if v.ndim == 0 else v[stage])


@dataclass(frozen=True)
class Timeline:
    """Start and end of every instruction of every stage, and the batch's end."""

    start: list[list[float]]
    end: list[list[float]]
    step: float


def _meet(streams, pos, stage: int) -> tuple[int, int] | None:
    """The stage and index of the instruction the p2p at ``pos[stage]`` meets, if it is posted."""
    ins = streams[stage][pos[stage]]
    off, want = PEER[ins.name]
    peer = stage + off
    j = pos[peer]
    if j < len(streams[peer]):
        other = streams[peer][j]
        if other.name == want and other.micro_batch == ins.micro_batch:
            return peer, j
    return None


class _Run:
    """The state of a simulation: where each stage is in its stream, and its clock."""

    def __init__(self, streams, cost, eager_sends: bool, begin):
        self.streams, self.cost, self.eager = streams, cost, eager_sends
        p = len(streams)
        self.pos, self.clock = [0] * p, [float(b) for b in (begin or [0.0] * p)]
        self.start = [[0.0] * len(st) for st in streams]
        self.end = [[0.0] * len(st) for st in streams]
        self.posted: dict[tuple[str, int, int], float] = {}  # eager sends: (name, stage, micro-batch) -> posted at
        self.holders = [0, p - 1]

    def _set(self, s: int, i: int, t0: float, t1: float) -> None:
        self.start[s][i], self.end[s][i], self.clock[s] = t0, t1, t1

    def p2p(self, s: int, ins: Instr) -> bool:
        """Run the point-to-point at stage s if it can end now; False if it waits for its peer."""
        i = self.pos[s]
        if self.eager:
            if ins.name in (SEND_ACT, SEND_GRAD):  # the overlapped alternative: a send waits for nobody
                self.posted[(ins.name, s, ins.micro_batch)] = self.clock[s]
                self._set(s, i, self.clock[s], self.clock[s] + self.cost(s, i, ins))
                return True
            off, want = PEER[ins.name]
            sent = self.posted.get((want, s + off, ins.micro_batch))
            if sent is None:
                return False
            self._set(s, i, self.clock[s], max(self.clock[s], sent) + self.cost(s, i, ins))
            return True
        peer = _meet(self.streams, self.pos, s)
        if peer is None:
            return False
        # Both posted: each side ends its own cost after the later post (with equal costs, together).
        q, j = peer
        t0 = max(self.clock[s], self.clock[q])
        self._set(q, j, self.clock[q], t0 + self.cost(q, j, self.streams[q][j]))
        self._set(s, i, self.clock[s], t0 + self.cost(s, i, ins))
        self.pos[q] += 1
        return True

    def tied(self, s: int) -> bool:
        """The tied-embedding all-reduce: the holders (first and last stage) end it together."""
        group = self.holders if s in self.holders else [s]
        if not all(self.pos[g] < len(self.streams[g]) and self.streams[g][self.pos[g]].name == TIED for g in group):
            return False
        t0 = max(self.clock[g] for g in group)
        for g in group:
            i = self.pos[g]
            self._set(g, i, self.clock[g], t0 + self.cost(g, i, self.streams[g][i]))
            if g != s:
                self.pos[g] += 1
        return True


def simulate(
    stages: int,
    micro_batches: int,
    d: Durations,
    streams=None,
    cost=None,
    eager_sends: bool = False,
    begin=None,
) -> Timeline:
    """Run the streams with blocking point-to-point (a send and its receive end together, ``p2p``
    after the later is posted) and the end-of-batch collectives as the module says.

    ``streams`` defaults to ``stream`` of every stage; ``cost(stage, index, instr)`` gives the
    seconds of each instruction when nothing waits (default: ``d``'s per kind; a census passes the
    measured ones). ``eager_sends`` is the alternative the census rules out: sends that overlap (a
    send costs its transfer and waits for nobody; its receive ends a transfer after the later of
    its own post and the send's). ``begin`` is each stage's clock at the start (default 0)."""
    p = stages
    streams = streams or [stream(s, p, micro_batches) for s in range(p)]
    run = _Run(streams, cost or (lambda s, i, ins: d.of(ins.name, s)), eager_sends, begin)
    pos = run.pos
    while True:
        moved = False
        for s in range(p):
            while pos[s] < len(streams[s]):
                ins = streams[s][pos[s]]
                if ins.name in P2P:
                    if not run.p2p(s, ins):
                        break
                elif ins.name == TIED:
                    if not run.tied(s):
                        break
                else:
                    run._set(s, pos[s], run.clock[s], run.clock[s] + run.cost(s, pos[s], ins))
                pos[s] += 1
                moved = True
        if all(pos[s] == len(streams[s]) for s in range(p)):
            break
        if not moved:
            raise RuntimeError(f"pipeline schedule deadlocks at {[streams[s][pos[s]] for s in range(p)]}")
    return Timeline(start=run.start, end=run.end, step=max(run.clock) + d.finish)


def exposed_transfers(stages, micro_batches):
    """Point-to-point transfers on the critical path of a batch with equal stages (arrays): the
    batch takes ``(m + p - 1) (F + B) + exposed_transfers(p, m) * p2p`` (``closed_form``; checked
    against ``simulate`` over a grid in tests/unit/test_pipe_schedule.py). Two stages exchange one
    activation and one gradient per micro-batch; from three on, a middle stage waits for four
    transfers per micro-batch (it sends and receives in both directions, one after the other), less
    what the fill and the drain skip."""
    p, m = np.asarray(stages, dtype=np.float64), np.asarray(micro_batches, dtype=np.float64)
    general = np.where(m <= 1, 2 * (p - 1), 4 * m + 2 * p - 8)
    return np.where(p <= 1, 0.0, np.where(p == 2, 2 * m, general))


def partition_gathers(stages):
    """TP all-gathers per micro-batch on the busiest stage with ``pipe_partitioned`` and
    ``grad_partitioned`` (engine.py): the forward of every stage but the first gathers its input
    (_exec_forward_pass: ``part_input.full()``), the backward of every stage but the last gathers
    its own output back (it was partitioned after the forward) and the gradient it received
    (_exec_backward_pass: ``part_output.full()``, ``part_grad.full()``). A middle stage does all
    three; with two stages the first does two, the last one."""
    p = np.asarray(stages, dtype=np.float64)
    return np.where(p <= 1, 0.0, np.where(p == 2, 2.0, 3.0))


def closed_form(stages, micro_batches, forward, backward, p2p=0.0, tied=0.0, reduce=0.0, optimizer=0.0, finish=0.0):
    """The batch time of equal stages (arrays broadcast): the fill and drain bubble of the 1F1B
    order, ``m + p - 1`` forward/backward pairs on the critical path, the exposed transfers, then
    what runs after the flush one after the other on the last stage to finish (the first: the
    tied-embedding all-reduce waits for it, the data-parallel reduction and the optimizer follow)."""
    p, m = np.asarray(stages, dtype=np.float64), np.asarray(micro_batches, dtype=np.float64)
    pipe = (m + p - 1) * (np.asarray(forward) + np.asarray(backward)) + exposed_transfers(p, m) * np.asarray(p2p)
    return pipe + tied + reduce + optimizer + finish
