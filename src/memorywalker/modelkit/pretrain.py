"""A short pretraining stage for the kit model: copying, plus language modelling of its corpus.

An agent that keeps notes copies: a code from an observation into a note, a note into a summary, a
name from the task into a tool call. A randomly initialised model fine-tuned on agent transcripts for a
few minutes on a CPU learns the transcript's boilerplate but not this skill (measured: the loss settles
on the copied tokens at the entropy of a uniform guess, docs/demo.md, "What was tried"). Copying is what
induction heads do, and they form within a few hundred steps on sequences that repeat (Olsson et al.,
2022, "In-context learning and induction heads"). So before any agent data the kit model sees a batch
that is half

* **repeated random sequences**: ``x x`` with ``x`` of :data:`COPY_LEN` random tokens, separators
  (newline, ``:``, ``,``, ``-``) every 1–3 tokens, loss on the second ``x`` only. Separators recur, so
  after one the model has to match on more than the current token — as it must after ``kal:`` in a
  note; and
* **language modelling** of windows of the kit corpus, so the model's token statistics stay those of
  text and the agent fine-tuning that follows starts from a sensible loss (measured: 5.2 nats instead
  of 14 without it).

The copy rows are placed in two stages (measured, docs/demo-robustness.md), because where they sit
decides whether copying is learned at all:

* With rows at a fixed place (``x x`` at position 0, the copies exactly :data:`COPY_LEN` apart),
  held-out accuracy on such rows is 1.0 after 300 steps, and 0.01-0.02 on rows 0..320 tokens in with
  a gap between the copies: the model has learned "the token 32 back", a position, not a match.
* With rows at transcript positions from the first step (a corpus prefix of up to 320 tokens and up
  to 32 random tokens between the copies; the demo's setting until 2026-12-03) nothing is learned: the
  copy loss sits near 5.5 nats for 400 steps, held-out accuracy 0.125-0.132 on every seed tried.
* Rows at position 0 with 0..32 random tokens between the copies (*near* rows) force a match on
  content; the accuracy on them sits near 0.3, then jumps past 0.9 (at steps 1,100-1,400 in the
  demo's runs of seeds 0-4).
  Once it has, 100 steps of half near, half *far* rows (the prefix as well) lift the far rows from
  0.15 to 0.86-0.92: the match carries to any position.

So stage 1 trains near rows until a held-out check passes (the jump's step depends on the seed, so a
fixed count would be a lottery), stage 2 a fixed number of steps on the near/far mix.

Nothing here knows about any task: the random sequences use the whole vocabulary and the corpus is the
tokenizer's own. Seeded; same arguments, same weights.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from memorywalker.errors import InputError

COPY_LEN = 32  # tokens of x in each "x x" row
LM_LEN = 64  # tokens of each corpus window
SEPARATORS = ("Ċ", ":", ",", "-", "Ġ-")  # byte-level BPE spellings of "\n", ":", ",", "-", " -"
HELDOUT_ROWS = 64  # copy rows drawn apart from training's, for :func:`copy_accuracy` at the end


class Pretrained(NamedTuple):
    dir: Path
    losses: list[float]  # every step's loss
    copy_accuracy: float  # greedy accuracy on held-out copy rows placed as the last stage placed its rows
    near_checks: list[tuple[int, float]]  # (step, held-out near-row accuracy) of each check in stage 1
    learned: bool  # stage 1 reached copy_target (True when there was none)

    @property
    def near_steps(self) -> int:
        """Steps stage 1 took: its last check is at its last step (it checks at the cap too)."""
        return self.near_checks[-1][0]


def copy_row(gen: random.Random, vocab: int, separators: list[int], first: int) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one repeated random sequence; labels are -100 on the first copy.

    >>> ids, labels = copy_row(random.Random(0), 100, [5], first=10)
    >>> ids[:COPY_LEN] == ids[COPY_LEN:] == labels[COPY_LEN:], labels[:COPY_LEN] == [-100] * COPY_LEN
    (True, True)
    """
    x: list[int] = []
    while len(x) < COPY_LEN:
        x += [gen.randrange(first, vocab) for _ in range(gen.randint(1, 3))]
        x.append(gen.choice(separators))
    x = x[:COPY_LEN]
    return x + x, [-100] * COPY_LEN + x


def _offset(gen: random.Random, row: tuple[list[int], list[int]], stream: list[int], max_offset: int, vocab: int,
            first: int) -> tuple[list[int], list[int]]:
    """``row`` after a corpus window of 0..``max_offset`` tokens, its copies 0..32 random tokens apart."""
    ids, labels = row
    n = gen.randint(0, min(max_offset, len(stream) - 1))  # the corpus is longer than LM_LEN (checked)
    s = gen.randrange(len(stream) - n) if n else 0
    prefix = stream[s:s + n]
    gap = [gen.randrange(first, vocab) for _ in range(gen.randint(0, 32))]
    x = ids[:COPY_LEN]
    return prefix + x + gap + x, [-100] * (len(prefix) + COPY_LEN + len(gap)) + x


@torch.no_grad()
def copy_accuracy(model, rows: list[tuple[list[int], list[int]]]) -> float:
    """Greedy accuracy of ``model`` on the labelled tokens of ``rows`` (teacher-forced, one forward).

    The label at position ``i`` is predicted by the logits at ``i - 1``; rows are right-padded and
    the padding is masked out. This is what "the model can copy" means here: on a held-out ``x x``
    row, the fraction of the second copy's tokens whose argmax is the token the first copy shows.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> _ = torch.manual_seed(0)
    >>> m = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> rows = [copy_row(random.Random(k), 50, [5], first=10) for k in range(4)]
    >>> 0.0 <= copy_accuracy(m, rows) < 0.2   # a random model guesses about 1 in 50
    True
    """
    was_training = model.training
    model.eval()
    ids, labels, mask = _batch(rows)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [rows, width-1, V]
    labels = labels[:, 1:]  # the token each position predicts
    scored = labels != -100
    hits = (logits.argmax(-1) == labels) & scored
    model.train(was_training)
    return hits.sum().item() / max(1, scored.sum().item())


def _batch(rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, labels, attention mask) of ``rows``, right-padded: padding is masked, no label."""
    width = max(len(r[0]) for r in rows)
    ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows])
    labels = torch.tensor([r[1] + [-100] * (width - len(r[1])) for r in rows])
    mask = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
    return ids, labels, mask


def pretrain(model_dir: str | os.PathLike, out_dir: str | os.PathLike, corpus: Iterable[str], *, steps: int = 1600,
             copy_target: float | None = 0.9, check_every: int = 100, far_steps: int = 200, max_offset: int = 0,
             batch_size: int = 32, lr: float = 1e-3, grad_clip: float = 1.0, seed: int = 0,
             log=None, progress: bool = False) -> Pretrained:
    """Train the model in ``model_dir`` on the copy/LM mix; save it (with its tokenizer) to ``out_dir``.

    Each step is ``batch_size // 2`` copy rows and as many corpus windows, AdamW at a constant ``lr``,
    gradients clipped to norm ``grad_clip``. Two stages:

    1. **near**: copy rows at position 0, their two copies 0..32 random tokens apart, for at most
       ``steps`` steps; every ``check_every`` steps the greedy accuracy on :data:`HELDOUT_ROWS` held-out
       near rows is measured and the first at ``copy_target`` ends the stage (``None``: all ``steps``).
    2. **far** (only with ``max_offset`` > 0): ``far_steps`` steps whose copy rows are half near rows,
       half rows after a corpus window of 0..``max_offset`` tokens, so the copying is used at the
       positions an agent transcript has.

    :attr:`Pretrained.copy_accuracy` is measured on held-out rows placed as the last stage placed its
    rows, from a generator of their own (measuring changes no training step). Seeded: same arguments,
    same weights; the step at which the near check passes is part of that.
    """
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    vocab = tok.get_vocab()
    separators = [vocab[s] for s in SEPARATORS if s in vocab]
    first = len(tok.all_special_ids)  # the specials come first in the kit vocabulary; never sampled
    stream: list[int] = []
    for text in corpus:
        stream += tok(text + "\n", add_special_tokens=False)["input_ids"]
    if len(stream) <= LM_LEN:
        raise InputError(f"pretraining corpus has {len(stream)} tokens; need more than {LM_LEN}")
    if steps < 1:
        raise InputError(f"pretraining needs at least one near step, got steps={steps}")

    def row(g: random.Random, offset: int):  # offset 0: a near row; max_offset: a far one
        return _offset(g, copy_row(g, len(tok), separators, first), stream, offset, len(tok), first)

    gen = random.Random(f"pretrain-{seed}")
    held = random.Random(f"pretrain-heldout-{seed}")
    heldout_near = [row(held, 0) for _ in range(HELDOUT_ROWS)]
    heldout_far = [row(held, max_offset) for _ in range(HELDOUT_ROWS)] if max_offset else heldout_near
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    losses: list[float] = []
    checks: list[tuple[int, float]] = []
    half = batch_size // 2

    def step(rows) -> tuple[float, float]:
        starts = [gen.randrange(len(stream) - LM_LEN) for _ in range(batch_size - half)]
        copy_ids, copy_labels, copy_mask = _batch(rows)
        lm_ids = torch.tensor([stream[s:s + LM_LEN] for s in starts])
        # Two forwards (the rows differ in length); one loss averaged over both halves' targets.
        copy_loss = model(input_ids=copy_ids, attention_mask=copy_mask, labels=copy_labels).loss
        lm_loss = model(input_ids=lm_ids, labels=lm_ids).loss
        loss = (copy_loss + lm_loss) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss.item())
        return copy_loss.item(), lm_loss.item()

    bar = tqdm(total=steps + (far_steps if max_offset else 0), desc="pretrain", unit="step", disable=not progress)
    for n in range(1, steps + 1):
        copy_loss, lm_loss = step([row(gen, 0) for _ in range(half)])
        bar.update()
        if n % check_every == 0 or n == steps:
            checks.append((n, copy_accuracy(model, heldout_near)))
            if log is not None:
                log(f"[pretrain] near step {n}/{steps}: copy {copy_loss:.3f} lm {lm_loss:.3f}, held-out copy "
                    f"accuracy {checks[-1][1]:.3f}")
            if copy_target is not None and checks[-1][1] >= copy_target:
                break
    learned = copy_target is None or checks[-1][1] >= copy_target
    if not learned and log is not None:
        log(f"[pretrain] DID NOT LEARN TO COPY: held-out copy accuracy {checks[-1][1]:.3f} < {copy_target} after "
            f"{steps} near steps")
    if max_offset:
        bar.total = n + far_steps
        for _ in range(far_steps):
            copy_loss, lm_loss = step([row(gen, 0 if k % 2 else max_offset) for k in range(half)])
            bar.update()
        if log is not None:
            log(f"[pretrain] far {far_steps} steps: copy {copy_loss:.3f} lm {lm_loss:.3f}")
    bar.close()
    accuracy = copy_accuracy(model, heldout_far)
    if log is not None:
        log(f"[pretrain] copy accuracy {accuracy:.3f} on {HELDOUT_ROWS} held-out rows"
            + (f" up to {max_offset} tokens in" if max_offset else ""))
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return Pretrained(out, losses, accuracy, checks, learned)
