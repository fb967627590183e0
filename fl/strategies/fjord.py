"""FjORD: Ordered Dropout with per-step width sampling and nested aggregation.

* Width set: uniform-k, ``P = {1/k, 2/k, ..., 1}`` (option ``k``, 5 in the paper).
  A client's ``capacity`` (the paper's ``p_max``) is the largest ``p in P`` not above the
  capacity it was given; it receives the prefix sub-model ``F_{capacity}`` (``ceil(p*K)``
  neurons per layer, paper section 3.1).
* Local training (`train_ordered`, trainer ``"fjord"``): at every local step the client
  samples ``p`` uniformly from ``{p in P : p <= capacity}`` (Algorithm 1, line 5) and takes
  a plain SGD step on the ``p``-prefix sub-network of its ``capacity`` parameters. With
  ``kd=true`` (self-distillation, section 3.2 with the paper's best alpha = T = 1) the
  step's loss is ``CE(F_{capacity}(x), y) + KL(softmax(F_{capacity}(x)) || softmax(F_p(x)))``
  with the teacher's distribution detached, so the teacher is trained by its own
  cross-entropy and the sampled width learns to mimic it; when ``p = capacity`` the
  step is the teacher's cross-entropy alone.
* Aggregation (eq. 1): for every width ``s_j`` the block ``F_{s_j}`` minus ``F_{s_{j-1}}`` is the
  example-weighted average over the clients with ``capacity >= s_j``. Those are exactly the
  clients whose nested sub-model holds the block, so eq. 1 is the per-weight average
  over holders, `fl.maths.aggregate.selective_average` weighted by examples; weights no client
  held keep their value.
* BatchNorm: FjORD keeps separate running statistics per width. The zoo's BN layers keep
  no running statistics at all: every width normalises with the statistics of the batch
  it is computing, in training and in evaluation. Per-width statistics therefore come
  for free (each width's activations are normalised by their own batch statistics) and
  there is nothing to store, average or recompute; the price is that evaluation depends
  on the evaluated batch (use reasonably large evaluation batches), and the affine BN
  parameters are shared and sliced like every other weight.

How a step trains the prefix: the client's ``capacity`` parameters are leaf tensors; for
width ``p`` every parameter is viewed as its prefix slice (``narrow``; an index select
for LSTM gate blocks) and the width-``p`` module (built once per width) runs on those
views through ``torch.func.functional_call``. The gradient of the loss then lands in
the prefix of the leaves and is exactly zero elsewhere, so the SGD update equals
"copy the prefix into the width-p module, step, copy back", without the copies.
Momentum and weight decay would move weights outside the prefix, so this trainer is
plain SGD and refuses them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from exporters.arch import Arch, SubModel, expand_indices
from exporters.userinput import InputError
from exporters.zoo import ZooModel
from fl.client import batches, to_tensors
from fl.maths.submodels import static_submodel
from fl.records import ClientSpec, Params, TrainIns
from fl.renamed_keys import current_train_config
from fl.strategies.fedavg import FedAvg

#: Tolerance when comparing a capacity with a width of the set.
_EPS = 1e-9


def width_set(k: int) -> tuple[float, ...]:
    """Return FjORD's uniform-k width set ``(1/k, 2/k, ..., 1)``.

    Parameters
    ----------
    k : int
        Number of widths (>= 1).

    Returns
    -------
    tuple of float
    """
    if k < 1:
        raise InputError(f"fjord: k={k} must be >= 1")
    return tuple(i / k for i in range(1, k + 1))


def capacity_for(capacity: float, widths: Sequence[float]) -> float:
    """Return a client's FjORD capacity: the largest width of ``widths`` not above ``capacity``.

    Parameters
    ----------
    capacity : float
        The capacity the client was given (`fl.records.ClientSpec.capacity`).
    widths : sequence of float
        The width set.

    Returns
    -------
    float

    Raises
    ------
    InputError
        If every width exceeds the capacity.
    """
    fitting = [w for w in widths if w <= capacity + _EPS]
    if not fitting:
        raise InputError(f"fjord: capacity {capacity} is below the smallest width {min(widths)}")
    return max(fitting)


class FjORD(FedAvg):
    """FjORD (Ordered Dropout, uniform-k widths, nested aggregation).

    Parameters
    ----------
    model, initial, seed, local
        As for `FedAvg`.
    **options
        ``k`` (int, default 5): the uniform-k width set; ``kd`` (bool, default False):
        self-distillation; ``weighted`` (bool, default True): eq. 1's weighting by
        examples.
    """

    name = "fjord"
    defaults: Mapping[str, Any] = {"k": 5, "kd": False, "weighted": True}

    def check_options(self) -> None:
        """Build the uniform-k width set from ``k``."""
        self.widths = width_set(int(self.options["k"]))

    def check_clients(self, clients: Sequence[ClientSpec]) -> None:
        """Refuse a client whose capacity is below the smallest width ``1/k``.

        Parameters
        ----------
        clients : sequence of ClientSpec

        Raises
        ------
        InputError
            Naming the client, its capacity and the width set.
        """
        for client in clients:
            try:
                capacity_for(client.capacity, self.widths)
            except InputError:
                raise InputError(
                    f"fjord: client {client.cid} has capacity {client.capacity:g}, below the smallest width "
                    f"1/k = {min(self.widths):g}; give it a capacity of at least that, or raise k (--opt k=...)"
                ) from None

    def submodel_for(self, rnd: int, client: ClientSpec) -> SubModel:
        """Return the prefix sub-model at the client's ``capacity``."""
        return static_submodel(self.model, capacity_for(client.capacity, self.widths))

    def trainer_config(self, rnd: int, client: ClientSpec, submodel: SubModel) -> dict[str, Any]:
        """Name the ``fjord`` trainer and pass the widths the client may sample and ``kd``."""
        capacity = capacity_for(client.capacity, self.widths)
        return {
            "trainer": "fjord",
            "widths": [w for w in self.widths if w <= capacity + _EPS],
            "capacity": capacity,
            "kd": bool(self.options["kd"]),
        }

    def step_widths(self, ins: TrainIns, client: ClientSpec) -> dict[float, float] | None:
        """Return the work the client's round trains at each width, in full-batch steps.

        The widths are `drawn_widths` of its instruction; an epoch's short last batch counts
        its share of a full one.
        """
        config = ins.config
        if not config.get("widths") or "seed" not in config:
            return None
        batch, examples = int(config["batch_size"]), client.num_examples
        draws = drawn_widths(
            [float(w) for w in config["widths"]], int(config["seed"]), examples, batch, int(config["epochs"])
        )
        per_epoch = -(-examples // batch)
        out: dict[float, float] = {}
        for i, width in enumerate(draws):
            out[width] = out.get(width, 0.0) + min(batch, examples - (i % per_epoch) * batch) / batch
        return dict(sorted(out.items()))

    def eval_submodels(self, clients: Sequence[ClientSpec]) -> dict[float, SubModel]:
        """Evaluate every width of the set up to the largest client ``capacity``, largest first."""
        if not clients:
            return {}
        top = max(capacity_for(c.capacity, self.widths) for c in clients)
        return {w: static_submodel(self.model, w) for w in sorted(self.widths, reverse=True) if w <= top + _EPS}


def _prefix_index(model: ZooModel, arch: Arch, outer: Arch) -> dict[str, list[tuple[int, int | torch.Tensor]]]:
    """Per parameter, per sliced axis: a prefix length (narrow) or a position tensor (index select).

    Positions are relative to the ``outer`` (``capacity``) tensors, whose group sizes are
    ``outer.sizes``.
    """
    order = {g: i for i, g in enumerate(model.group_names)}
    out: dict[str, list[tuple[int, int | torch.Tensor]]] = {}
    for name, layout in model.layouts.items():
        steps: list[tuple[int, int | torch.Tensor]] = []
        for axis, dim in enumerate(layout):
            if dim is None:
                continue
            g = order[dim.group]
            if arch.sizes[g] == outer.sizes[g]:
                continue
            if dim.blocks == 1:
                steps.append((axis, arch.sizes[g] * dim.inner))
            else:
                pos = expand_indices(np.arange(arch.sizes[g], dtype=np.int64), dim, outer.sizes[g])
                steps.append((axis, torch.from_numpy(pos)))
        out[name] = steps
    return out


def _views(
    leaves: Mapping[str, torch.Tensor], index: Mapping[str, list[tuple[int, int | torch.Tensor]]]
) -> dict[str, torch.Tensor]:
    out = {}
    for name, leaf in leaves.items():
        t = leaf
        for axis, sel in index[name]:
            t = t.narrow(axis, 0, sel) if isinstance(sel, int) else t.index_select(axis, sel)
        out[name] = t
    return out


def drawn_widths(widths: Sequence[float], seed: int, examples: int, batch: int, epochs: int) -> list[float]:
    """Return the width each local step of a client's round trains, in order.

    `train_ordered` and the devices' runner draw one index per batch of the shuffled
    shard from ``default_rng((seed, 1))``, the short last batch included, so the server
    knows a round's widths before it runs.

    Parameters
    ----------
    widths : sequence of float
        The widths the client samples from (its instruction's ``widths``).
    seed : int
        The instruction's ``seed``.
    examples, batch, epochs : int
        The client's shard size, the local batch size and the local epochs.

    Returns
    -------
    list of float
    """
    rng = np.random.default_rng((seed, 1))
    return [float(widths[int(rng.integers(len(widths)))]) for _ in range(epochs * -(-examples // batch))]


def train_ordered(model: ZooModel, ins: TrainIns, x: np.ndarray, y: np.ndarray) -> tuple[Params, dict[str, float]]:
    """Train with Ordered Dropout: a width sampled per step, SGD on its prefix sub-network.

    Parameters
    ----------
    model : ZooModel
    ins : TrainIns
        ``submodel`` is the client's ``capacity`` prefix sub-model and ``parameters`` its
        parameters. ``config`` keys: ``widths`` (the widths the client may sample; each
        must fit inside the ``capacity`` sub-model; default: only ``capacity``), ``kd`` (bool),
        ``epochs``, ``batch_size``, ``lr``, ``seed``. Batches are shuffled by
        ``numpy.random.default_rng(seed)`` exactly as `fl.client.train_plain` does;
        widths are drawn uniformly, one per step, by `drawn_widths`. A config written
        under the old key ``p_max`` is read as ``capacity`` (`fl.renamed_keys`).

    Returns
    -------
    params : Params
        Trained ``capacity`` parameters.
    metrics : dict
        ``loss`` (the optimised loss) and ``accuracy`` (of the sampled width's output)
        over the last epoch, ``steps`` and ``mean_width`` (mean sampled width; without
        ``widths`` every step is ``capacity``, read from ``config["capacity"]``, default 1).

    Raises
    ------
    InputError
        If a width does not fit in the ``capacity`` sub-model, or momentum / weight decay
        is requested.
    """
    cfg = current_train_config(ins.config)
    for key in ("momentum", "weight_decay"):
        if float(cfg.get(key, 0.0)) != 0.0:
            raise InputError(f"fjord trainer: {key}={cfg[key]} is not supported (plain SGD only)")
    outer = ins.submodel.arch
    widths = [float(w) for w in cfg.get("widths", [])]
    archs = [model.arch(w) for w in widths] or [outer]
    widths = widths or [float(cfg.get("capacity", 1.0))]
    for width, arch in zip(widths, archs, strict=True):
        if any(w > o for w, o in zip(arch.sizes, outer.sizes, strict=True)):
            raise InputError(f"fjord trainer: width {width} does not fit in the client's sub-model {outer.key()}")
    seed = int(cfg.get("seed", 0))
    lr = float(cfg.get("lr", 0.05))
    kd = bool(cfg.get("kd", False))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    epochs, batch = int(cfg.get("epochs", 1)), int(cfg.get("batch_size", 20))
    step_widths = drawn_widths(widths, seed, len(y), batch, epochs)

    leaves = {k: torch.tensor(np.asarray(v, dtype=np.float32), requires_grad=True) for k, v in ins.parameters.items()}
    modules: dict[tuple[int, ...], nn.Module] = {}
    indices: dict[tuple[int, ...], dict[str, list[tuple[int, int | torch.Tensor]]]] = {}

    def forward(arch: Arch, xb: torch.Tensor) -> torch.Tensor:
        if arch.sizes not in modules:
            modules[arch.sizes] = model.build(arch).train()
            indices[arch.sizes] = _prefix_index(model, arch, outer)
        out: torch.Tensor = functional_call(modules[arch.sizes], _views(leaves, indices[arch.sizes]), (xb,))
        return out

    xt, yt = to_tensors(model, x, y)
    steps = 0
    width_sum = loss_sum = correct = seen = 0.0
    for _ in range(epochs):
        loss_sum = correct = seen = 0.0
        for idx in batches(len(yt), batch, rng):
            width = step_widths[steps]
            arch = archs[widths.index(width)]
            xb, yb = xt[idx], yt[idx]
            if kd:
                teacher = forward(outer, xb)
                loss = nn.functional.cross_entropy(teacher, yb)
                out = teacher
                if arch.sizes != outer.sizes:
                    out = forward(arch, xb)
                    target = torch.softmax(teacher.detach(), dim=1)
                    loss = loss + nn.functional.kl_div(torch.log_softmax(out, dim=1), target, reduction="batchmean")
            else:
                out = forward(arch, xb)
                loss = nn.functional.cross_entropy(out, yb)
            loss.backward()
            with torch.no_grad():
                for leaf in leaves.values():
                    if leaf.grad is not None:
                        leaf -= lr * leaf.grad
                        leaf.grad = None
            steps += 1
            width_sum += width
            loss_sum += loss.item() * len(idx)
            correct += float((out.argmax(1) == yb).sum())
            seen += len(idx)
    seen = max(seen, 1.0)
    params = {k: v.detach().numpy().astype(np.float32, copy=True) for k, v in leaves.items()}
    metrics = {"loss": loss_sum / seen, "accuracy": correct / seen, "steps": float(steps)}
    metrics["mean_width"] = width_sum / steps if steps else 0.0
    return params, metrics
