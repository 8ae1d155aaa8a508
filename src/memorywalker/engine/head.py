"""The LM head at the predicting positions only, one chunk of targets at a time.

With a real vocabulary (128K–262K entries) the [targets, V] logits are the largest tensors of a step:
6,332 targets at V = 151,936 are 3.8 GB per fp32 copy, and autograd keeps several copies for the
backward (measured before this module: 18.6 GiB peak for a 12-call session slice). So the model runs
its own forward (its hooks, FSDP and PEFT wrappers intact) with the head applied to one row only
(:func:`capture_hidden` records the hidden states the head would have received), and the head is
applied here to those hidden states in chunks of ``chunk`` rows:

    z = transform(head(h)) / T                      (fp32; transform = the model's soft-capping/scale)
    log p(y) = z_y − logsumexp(z)

A chunk's forward keeps no [c, V] tensor alive; its backward recomputes the chunk's logits and forms
the gradient of the log-probability in place,

    ∂ log p(y) / ∂z_v = 1[v = y] − softmax(z)_v

A plain ``nn.Linear`` head (tied or not) runs all chunks in one autograd function
(:class:`_LinearLabelLogprob`: saves the hidden states and the log-sum-exps, recomputes each chunk's
logits once in the backward, accumulates the weight gradient in one [V, H] buffer); any other head (a
PEFT-wrapped one, whose adapter must see the input) runs each chunk under a non-reentrant activation
checkpoint (:class:`_LabelLogprob` on its logits). Peak memory is one chunk's logits and their
gradient, whatever the number of targets. The same holds for SDCC's KL (:func:`chunked_forward_kl`: the
teacher's distribution is recomputed from its detached hidden states inside the student's chunk) and
the drift metric (:func:`chunked_total_variation`).

No fused GPU kernel (Liger's fused linear cross-entropy and the like) is used: they return a reduced loss
over a plain weight matrix, not per-target log-probabilities through a PEFT-wrapped head, and no GPU was
available to test one. This path is plain PyTorch on every device.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from memorywalker.errors import InputError
from memorywalker.objectives.losses import forward_kl

# Rows per chunk: enough that one fp32 [rows, V] chunk is about this many bytes.
CHUNK_BYTES = 128 * 2**20


def chunk_rows(vocab_size: int, budget: int = CHUNK_BYTES) -> int:
    """Rows of one chunk so that a float32 [rows, V] tensor takes about ``budget`` bytes.

    >>> chunk_rows(151_936), chunk_rows(782)
    (220, 42908)
    """
    return max(1, budget // (4 * vocab_size))


def _unwrap(model):
    return getattr(model, "module", model)  # DDP / FSDP wrappers


@dataclass(frozen=True)
class OutputHead:
    """The model's output projection and the fixed transform its forward applies to the logits.

    ``module`` is what ``model.get_output_embeddings()`` returns: a plain ``Linear``, a tied embedding
    matrix's ``Linear``, or a PEFT-wrapped layer (calling the module applies its adapter). ``softcap``
    (Gemma 2/3 ``final_logit_softcapping``: ``cap · tanh(z / cap)``) and ``scale`` (Cohere
    ``logit_scale``; Granite ``1 / logits_scaling``) are read from the model; :func:`capture_hidden`
    checks once per model that ``logits()`` reproduces the model's own output, so a transform not
    listed here fails loudly instead of giving wrong log-probabilities.
    """

    module: torch.nn.Module
    softcap: float | None = None
    scale: float = 1.0

    @classmethod
    def of(cls, model) -> OutputHead:
        inner = _unwrap(model)
        module = inner.get_output_embeddings()
        if module is None:
            raise InputError(f"{type(inner).__name__} has no output embeddings: not a causal LM")
        config = inner.config
        text = getattr(config, "get_text_config", lambda: config)()
        scale = float(getattr(inner, "logit_scale", None) or 1.0)  # Cohere: z · logit_scale
        if getattr(text, "logits_scaling", None):  # Granite: z / logits_scaling
            scale /= float(text.logits_scaling)
        return cls(module, getattr(text, "final_logit_softcapping", None), scale)

    @property
    def vocab_size(self) -> int:
        return int(self.module.weight.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, H] -> float32 [n, V]: the model's logits at these hidden states."""
        return _transformed(self, self.module(hidden), 1.0)


# --- running the model without its head ----------------------------------------------------------


class Capture:
    """The hidden states the model's head received in the last forward ([1, P, H]: the positions the
    forward kept with ``logits_to_keep``), with their graph."""

    def __init__(self):
        self.hidden: torch.Tensor | None = None


_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head module -> checked once


@contextmanager
def capture_hidden(model, head: OutputHead) -> Iterator[Capture]:
    """Run ``model`` forwards whose head sees one row only; the rows it would have seen are recorded.

    Inside the block every ``model(..., logits_to_keep=keep)`` computes the network up to the head as
    usual, then the head's forward pre-hook stores its input in ``capture.hidden`` and lets only the
    first row through (``out.logits`` is [1, 1, V]); pass both to :func:`check_head_logits`. Apply the
    head to the captured states after the block (inside it, the hook would cut them to one row).
    """
    cap = Capture()

    def pre_hook(module, args):
        (hidden, *rest) = args
        cap.hidden = hidden
        return (hidden[:, :1], *rest)

    handle = head.module.register_forward_pre_hook(pre_hook)
    try:
        yield cap
    finally:
        handle.remove()


def check_head_logits(head: OutputHead, hidden: torch.Tensor, native_logits: torch.Tensor) -> None:
    """Once per head module: the model's own logits of the first kept row (``native_logits`` [..., V],
    what the head computed inside :func:`capture_hidden`) must equal ``head.logits`` of that row of
    ``hidden`` [P, H] (catches a logits transform this module does not know)."""
    if head.module in _VERIFIED or not len(hidden):
        return
    with torch.no_grad():
        ours = head.logits(hidden[:1])[0]
        native = native_logits.reshape(-1, native_logits.shape[-1])[0].float()
        tol = 1e-4 if native_logits.dtype == torch.float32 else 5e-2
        err = float((ours - native).abs().max() / native.abs().max().clamp(min=1.0))
    if err > tol:
        raise InputError(f"the logits of {type(head.module).__name__} head differ from the model's own by "
                         f"{err:.2e} (relative): the model transforms its logits in a way memorywalker does not "
                         "reproduce (supported: final_logit_softcapping, logit_scale, logits_scaling)")
    _VERIFIED[head.module] = True


# --- chunked log-probabilities -------------------------------------------------------------------


class _LabelLogprob(torch.autograd.Function):
    """``z_y − logsumexp(z)`` per row of ``logits / T`` in fp32, with its gradient formed in one buffer."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, temperature: float):
        z = logits.float()
        if temperature != 1.0:
            z = z / temperature  # tempered in fp32, as the sampler divides
        lse = torch.logsumexp(z, dim=-1)  # [c]
        out = z.gather(1, labels[:, None])[:, 0] - lse  # log p(y) = z_y − logsumexp(z)
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        t = ctx.temperature
        z = logits.float() / t if t != 1.0 else logits.float()
        g = (z - lse[:, None]).exp_()  # softmax(z), one [c, V] buffer reused below
        g.mul_(-grad[:, None])  # −softmax · ĝ
        g.scatter_add_(1, labels[:, None], grad[:, None])  # + 1[v = y] · ĝ
        if t != 1.0:
            g.div_(t)  # ∂z/∂logits = 1/T
        return g.to(logits.dtype), None, None


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise InputError(f"temperature={temperature}: must be > 0 (greedy rollouts record untempered logprobs: 1)")


def _chunks(n: int, rows: int) -> Iterator[slice]:
    for s in range(0, n, rows):
        yield slice(s, min(n, s + rows))


def _maybe_checkpoint(fn, *args):
    """``fn(*args)``; under autograd as a non-reentrant checkpoint (the backward recomputes it)."""
    if torch.is_grad_enabled() and any(a.requires_grad for a in args if isinstance(a, torch.Tensor)):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


# Rows of a chunk whose elementwise passes run together (an [8, V] block stays in cache).
BLOCK_ROWS = 8


class _LinearLabelLogprob(torch.autograd.Function):
    """log p(y) for every row of ``hidden`` through a plain linear head, chunk by chunk, in one function.

    Forward: per chunk ``z = transform(h W^T + b) / T`` (fp32) → ``log_softmax(z)_y``; only ``hidden``,
    the labels and the log-sum-exps [P] are saved. Backward: per chunk the logits are recomputed once and
    turned in place into ``∂/∂z = (1[v = y] − softmax(z)) · ĝ``, then ``∂h = ∂u W`` and ``∂W += ∂u^T h``
    accumulate into one [V, H] buffer. Two passes over each chunk's [c, V] logits per step instead of the
    three a checkpointed chunk takes (its recomputation repeats the forward's log-sum-exp). One [c, V]
    buffer serves every chunk: a fresh one per chunk costs its page faults again (measured: 40 % of a
    matmul's time at V = 151,936).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, head: OutputHead, temperature: float, rows: int):
        out = hidden.new_empty(len(labels), dtype=torch.float32)
        lse = hidden.new_empty(len(labels), dtype=torch.float32)
        buf = _Logits(hidden, weight, bias, rows)
        for s in _chunks(len(labels), rows):
            z = _transformed(head, buf.compute(s), temperature)
            y = labels[s, None]
            for b in _chunks(len(y), BLOCK_ROWS):  # log_softmax of a block in cache: fused, no [c, V] temporary
                z_b = z[b]
                logp_y = torch.log_softmax(z_b, dim=-1).gather(1, y[b])[:, 0]
                out[s][b] = logp_y  # log p(y) = z_y − logsumexp(z)
                lse[s][b] = z_b.gather(1, y[b])[:, 0] - logp_y
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.head, ctx.temperature, ctx.rows = head, temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        head, t = ctx.head, ctx.temperature
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.zeros_like(hidden) if need_h else None
        dw = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        db = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        buf = _Logits(hidden, weight, bias, ctx.rows)
        for s in _chunks(len(labels), ctx.rows):
            u = buf.compute(s)
            g = _transformed(head, u, t)  # z (u itself when untransformed: u is read again only with soft-capping)
            g.sub_(lse[s, None]).exp_()  # softmax(z)
            g.mul_(-grad[s, None])  # −softmax · ĝ
            g.scatter_add_(1, labels[s, None], grad[s, None])  # + 1[v = y] · ĝ
            g = _transform_backward(head, u, g, t)  # ∂/∂u
            if need_h:
                dh[s] = (buf.low(g) @ weight).to(hidden.dtype)  # ∂h = ∂u W
            if need_w:
                dw.addmm_(g.T, hidden[s].float())  # ∂W += ∂u^T h (accumulated in fp32)
            if need_b:
                db += g.sum(0)
        return (dh, None if dw is None else dw.to(weight.dtype), None if db is None else db.to(bias.dtype),
                None, None, None, None)


class _Logits:
    """``h W^T + b`` of a chunk of rows, as float32 [c, V] in a buffer reused by every chunk."""

    def __init__(self, hidden, weight, bias, rows: int):
        self.hidden, self.weight, self.bias = hidden, weight, bias
        rows = min(rows, len(hidden))
        self.buf = torch.empty(rows, weight.shape[0], dtype=torch.float32, device=weight.device)
        self.lowp = None if weight.dtype == torch.float32 else torch.empty(rows, weight.shape[0], dtype=weight.dtype,
                                                                           device=weight.device)

    def compute(self, s: slice) -> torch.Tensor:
        h = self.hidden[s]
        n = len(h)
        if self.lowp is None:
            u = torch.mm(h, self.weight.T, out=self.buf[:n])
        else:  # the model's dtype for the matmul (as its own head computes), then fp32
            u = self.buf[:n].copy_(torch.mm(h, self.weight.T, out=self.lowp[:n]))
        return u if self.bias is None else u.add_(self.bias)

    def low(self, g: torch.Tensor) -> torch.Tensor:
        """``g`` in the weight's dtype (for the ∂h matmul), in the low-precision buffer when there is one."""
        return g if self.lowp is None else self.lowp[:len(g)].copy_(g)


def _transformed(head: OutputHead, u: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 ``transform(u) / T`` of the head's raw output ``u`` (``u`` itself when fp32 and untransformed)."""
    z = u.float()
    if head.scale != 1.0:
        z = z * head.scale
    if head.softcap:
        z = torch.tanh(z / head.softcap) * head.softcap
    return z / temperature if temperature != 1.0 else z


def _transform_backward(head: OutputHead, u: torch.Tensor, grad_z: torch.Tensor, temperature: float) -> torch.Tensor:
    """∂/∂u from ∂/∂z of :func:`_transformed` (in place on ``grad_z``)."""
    if temperature != 1.0:
        grad_z.div_(temperature)
    if head.softcap:  # z = c·tanh(a / c): ∂z/∂a = 1 − tanh²(a / c)
        grad_z.mul_(1 - torch.tanh(u.float() * head.scale / head.softcap) ** 2)
    if head.scale != 1.0:  # a = scale · u
        grad_z.mul_(head.scale)
    return grad_z


TRANSPARENT_HOOKS = "_memorywalker_transparent_hooks"  # ids of hooks that leave a head's output as it is


def mark_transparent(module: torch.nn.Module, *handles) -> None:
    """Record that these hooks on ``module`` change neither its inputs' values nor its output (a
    sharded step's bookkeeping), so the head still counts as a plain linear layer."""
    module.__dict__.setdefault(TRANSPARENT_HOOKS, set()).update(h.id for h in handles)


def _plain_linear(module: torch.nn.Module) -> bool:
    """A bare ``nn.Linear`` whose forward is just ``F.linear`` (no hooks but transparent ones, no
    adapter, no offloading)."""
    ours = module.__dict__.get(TRANSPARENT_HOOKS, ())
    hooks = [k for k in (*module._forward_hooks, *module._forward_pre_hooks) if k not in ours]
    return type(module) is torch.nn.Linear and not hooks and not hasattr(module, "_hf_hook")


def target_logprobs(head: OutputHead, hidden: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                    chunk: int | None = None) -> torch.Tensor:
    """log p(label) at each hidden state: [P, H], int64 [P] -> float32 [P], differentiable.

    ``chunk`` rows at a time (default :func:`chunk_rows`); no [P, V] tensor exists at once, in the
    forward or the backward. A plain ``nn.Linear`` head (tied or not) runs :class:`_LinearLabelLogprob`;
    any other head (a PEFT-wrapped one) runs each chunk as ``head.module`` under a non-reentrant
    activation checkpoint. Both give the same values and gradients (tested).
    """
    _check_temperature(temperature)
    rows = chunk or chunk_rows(head.vocab_size)
    if not len(labels):
        return hidden.new_zeros(0, dtype=torch.float32)
    if _plain_linear(head.module):
        m = head.module
        return _LinearLabelLogprob.apply(hidden, m.weight, m.bias, labels, head, temperature, rows)

    def one(h, y):
        return _LabelLogprob.apply(head.logits(h), y, temperature)

    return torch.cat([_maybe_checkpoint(one, hidden[s], labels[s]) for s in _chunks(len(labels), rows)])


def log_softmax_rows(head: OutputHead, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """float32 [n, V] log-distribution of a few rows (a chunk's worth; for tests and small callers)."""
    z = head.logits(hidden)
    return torch.log_softmax(z / temperature if temperature != 1.0 else z, dim=-1)


def chunked_forward_kl(head: OutputHead, teacher_hidden: torch.Tensor, student_hidden: torch.Tensor, *,
                       temperature: float = 1.0, chunk: int | None = None) -> torch.Tensor:
    """Forward KL(teacher ‖ student) per row over full next-token distributions: [J, H] x2 -> [J].

    The teacher is a stop-gradient: its distribution is recomputed from ``teacher_hidden`` (detached)
    inside each student chunk, so neither side's [J, V] distributions are ever held.
    """
    _check_temperature(temperature)
    rows = chunk or chunk_rows(head.vocab_size)
    teacher_hidden = teacher_hidden.detach()

    def one(s, t):
        with torch.no_grad():
            log_t = log_softmax_rows(head, t, temperature)
        log_s = log_softmax_rows(head, s, temperature)
        return forward_kl(log_t, log_s)  # log-probabilities are logits of the same distributions

    if not len(student_hidden):
        return student_hidden.new_zeros(0, dtype=torch.float32)
    return torch.cat([_maybe_checkpoint(one, student_hidden[s], teacher_hidden[s])
                      for s in _chunks(len(student_hidden), rows)])


@torch.no_grad()
def chunked_total_variation(head: OutputHead, hidden_a: torch.Tensor, hidden_b: torch.Tensor, *,
                            temperature: float = 1.0, chunk: int | None = None) -> torch.Tensor:
    """TV(p_a, p_b) = ½ Σ_v |p_a(v) − p_b(v)| per row: [N, H] x2 -> float32 [N] (logit drift)."""
    rows = chunk or chunk_rows(head.vocab_size)
    out = [0.5 * (log_softmax_rows(head, hidden_a[s], temperature).exp()
                  - log_softmax_rows(head, hidden_b[s], temperature).exp()).abs().sum(-1)
           for s in _chunks(len(hidden_a), rows)]
    return torch.cat(out) if out else hidden_a.new_zeros(0, dtype=torch.float32)
