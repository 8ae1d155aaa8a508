"""The offline model kit: a real HF tokenizer with a chat template and tiny random causal LMs."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memorywalker.modelkit import build_model


def test_tokenizer_round_trips_any_text(tokenizer):
    """Byte-level BPE: decode(encode(x)) == x, including text far from the training corpus."""
    for text in ["plain words", "ünïcödé ✓ 漢字 🙂", "  leading spaces\n\ttabs", '{"json": [1, 2.5e-3]}', ""]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_chat_template_marks_turns_and_end_of_turn(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_ids_to_tokens(tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"]) == [
        "<|im_end|>"
    ]


def test_both_architectures_load_and_run(kit, qwen2_kit):
    for _tok_dir, model_dir, model_type in [(*kit, "llama"), (*qwen2_kit, "qwen2")]:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        assert model.config.model_type == model_type and model.config.vocab_size == len(tok)
        ids = torch.tensor([tok("hello world", add_special_tokens=False)["input_ids"]])
        logits = model(ids).logits
        assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()


def test_model_build_is_deterministic_in_the_seed(kit, tmp_path):
    tok_dir, _ = kit
    a = AutoModelForCausalLM.from_pretrained(build_model(tmp_path / "a", tok_dir, seed=3))
    b = AutoModelForCausalLM.from_pretrained(build_model(tmp_path / "b", tok_dir, seed=3))
    c = AutoModelForCausalLM.from_pretrained(build_model(tmp_path / "c", tok_dir, seed=4))
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


class _Peeker(torch.nn.Module):
    """A 'model' whose logits at position i put all mass on input_ids[i+1] (it peeks at the next token),
    except at positions listed in ``wrong``, where it predicts token 0. Only an alignment test can use it."""

    def __init__(self, wrong: set[int]):
        super().__init__()
        self.wrong = wrong

    def forward(self, input_ids, attention_mask):
        from types import SimpleNamespace

        nxt = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)  # [B, L]: the token after each position
        for i in self.wrong:
            nxt[:, i] = 0
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, 10).float())


def test_copy_accuracy_scores_the_labelled_tokens_by_the_logits_before_them():
    """Two rows: ids [1..6] with labels on positions 3..5, and [7, 8, 9] (padded to 6) with labels on
    1..2. The peeker is wrong at logit position 3 (which predicts position 4) and at position 5 (which
    predicts nothing: the last position). Scored tokens: row 1 positions 3, 4, 5 (predicted by 2, 3,
    4: right, wrong, right); row 2 positions 1, 2 (predicted by 0, 1: right, right); padding is never
    scored (row 2's logits at 3 predict a pad). Accuracy = 4 / 5 = 0.8."""
    from memorywalker.modelkit.pretrain import copy_accuracy

    rows = [([1, 2, 3, 4, 5, 6], [-100, -100, -100, 4, 5, 6]), ([7, 8, 9], [-100, 8, 9])]
    assert copy_accuracy(_Peeker(wrong={3, 5}), rows) == 0.8
    assert copy_accuracy(_Peeker(wrong=set()), rows) == 1.0


def test_pretraining_near_stage_ends_at_the_first_passing_check_and_the_far_stage_follows(kit, tmp_path):
    """Stage 1 checks at steps 2, 4 and 5 (every 2nd step and the last of 5). An unreachable target
    (2.0) runs all 5 near steps, says so, and then the 3 far steps: 5 + 3 = 8 losses. Target 0 passes at
    the first check: 2 near steps, 2 + 3 = 5 losses, and the weights are bitwise those of a 2-step run
    without a target (a check draws nothing from the training generator)."""
    from memorywalker.modelkit import bundled_corpus
    from memorywalker.modelkit.pretrain import pretrain

    _, model_dir = kit
    corpus = bundled_corpus()
    args = dict(check_every=2, far_steps=3, max_offset=64, batch_size=4, seed=1)
    said: list[str] = []
    never = pretrain(model_dir, tmp_path / "never", corpus, steps=5, copy_target=2.0, log=said.append, **args)
    assert [s for s, _ in never.near_checks] == [2, 4, 5] and never.near_steps == 5 and not never.learned
    assert len(never.losses) == 8 and any(line.startswith("[pretrain] DID NOT LEARN TO COPY") for line in said)

    first = pretrain(model_dir, tmp_path / "first", corpus, steps=5, copy_target=0.0, **args)
    assert [s for s, _ in first.near_checks] == [2] and first.near_steps == 2 and first.learned
    assert len(first.losses) == 5
    fixed = pretrain(model_dir, tmp_path / "fixed", corpus, steps=2, copy_target=None, **args)
    assert fixed.losses == first.losses and fixed.learned
    a = AutoModelForCausalLM.from_pretrained(first.dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(fixed.dir).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
