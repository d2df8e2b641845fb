"""The workload is deterministic, grows turn by turn, and is sized as asked."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from pdx_bench.workload import HFTokenizerCounter, WordCounter, Workload, WorkloadSpec, build, to_vllm_conversations


def _texts(spec: WorkloadSpec, label: str = "w") -> list[list[str]]:
    w = build(spec, label=label)
    return [[c.system or ""] + [t.content for t in c.turns] for c in w.conversations]


def test_same_seed_same_texts_and_label_only_renames() -> None:
    spec = WorkloadSpec(prefix_tokens=300, turns=3, conversations=2, seed=7)
    assert _texts(spec) == _texts(spec)
    # Legs get their own conversation ids but must send the same prompts.
    assert _texts(spec, "off") == _texts(spec, "on")
    ids_off = [c.conversation_id for c in build(spec, label="off").conversations]
    ids_on = [c.conversation_id for c in build(spec, label="on").conversations]
    assert set(ids_off).isdisjoint(ids_on)
    assert len(set(ids_off)) == 2


def test_other_seed_other_texts() -> None:
    assert _texts(WorkloadSpec(seed=1, prefix_tokens=200)) != _texts(WorkloadSpec(seed=2, prefix_tokens=200))


def test_word_sizing_is_exact() -> None:
    spec = WorkloadSpec(prefix_tokens=1000, turns=3, conversations=2, user_tokens=50, tool_tokens=120)
    w = build(spec)
    words = WordCounter()
    for conv in w.conversations:
        assert conv.system is not None and words.count(conv.system) == 1000
        assert conv.turns[0].tokens == 50
        assert all(t.tokens == 50 + 120 for t in conv.turns[1:])


def test_shared_prefix_and_distinct_conversations() -> None:
    w = build(WorkloadSpec(prefix_tokens=200, conversations=3, turns=2))
    assert len({c.system for c in w.conversations}) == 1
    assert len({c.turns[0].content for c in w.conversations}) == 3
    w2 = build(WorkloadSpec(prefix_tokens=200, conversations=3, turns=2, shared_prefix=False))
    assert len({c.system for c in w2.conversations}) == 3


def test_history_grows_with_answers() -> None:
    conv = build(WorkloadSpec(prefix_tokens=100, turns=4, conversations=1)).conversations[0]
    answers = ["answer one", "answer two", "answer three"]
    sizes = []
    for turn in range(1, 5):
        msgs = conv.messages_for(turn, answers[: turn - 1])
        assert msgs[0]["role"] == "system"
        assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * (turn - 1) + ["user"]
        assert msgs[-1]["content"] == conv.turns[turn - 1].content
        sizes.append(sum(len(m["content"].split()) for m in msgs))
        # Each turn re-sends the previous turn's prompt unchanged, then appends to it.
        if turn > 1:
            prev = conv.messages_for(turn - 1, answers[: turn - 2])
            assert msgs[: len(prev)] == prev
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert "Result of" in conv.turns[1].content and "Result of" not in conv.turns[0].content
    with pytest.raises(ValueError):
        conv.messages_for(3, ["only one"])


def test_min_tokens_follows_fixed_output() -> None:
    assert build(WorkloadSpec(output_tokens=20)).conversations[0].min_tokens == 20
    assert build(WorkloadSpec(output_tokens=20, fixed_output=False)).conversations[0].min_tokens is None


def test_vllm_format_folds_system_into_first_user_turn() -> None:
    spec = WorkloadSpec(prefix_tokens=100, turns=3, conversations=2, system_role=False)
    w = build(spec)
    data = to_vllm_conversations(w)
    assert [d["id"] for d in data] == [c.conversation_id for c in w.conversations]
    msgs = data[0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 3
    assert msgs[0]["content"].startswith("You are a coding agent")
    with pytest.raises(ValueError):
        to_vllm_conversations(build(WorkloadSpec(prefix_tokens=10)))


def test_arrivals_are_seeded_poisson() -> None:
    spec = WorkloadSpec(request_rate=4.0, turns=50, conversations=20, prefix_tokens=1)
    gaps = Workload(spec).arrival_gaps()
    assert gaps == Workload(spec).arrival_gaps()
    assert len(gaps) == 1000
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.15)
    assert build(WorkloadSpec()).arrival_gaps() == []


@pytest.mark.parametrize(
    "bad",
    [
        {"turns": 0},
        {"conversations": 0},
        {"concurrency": 0},
        {"output_tokens": 0},
        {"request_rate": -1},
        {"prefix_tokens": -5},
    ],
)
def test_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**bad)  # type: ignore[arg-type]


def test_last_turn_estimate_grows_with_everything() -> None:
    base = WorkloadSpec(prefix_tokens=4000, turns=4, user_tokens=64, tool_tokens=192, output_tokens=32)
    est = base.last_turn_tokens()
    assert est >= 4000 + 4 * (64 + 32) + 3 * 192
    assert (
        WorkloadSpec(prefix_tokens=4000, turns=5).last_turn_tokens()
        > WorkloadSpec(prefix_tokens=4000, turns=4).last_turn_tokens()
    )


def _tiny_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False)
    corpus = ["the quick brown fox jumps over the lazy dog and a tool result of search_docs"] * 50
    tok.train_from_iterator(corpus, trainer)
    out = path / "tokenizer.json"
    tok.save(str(out))
    return path


def test_tokenizer_sizing_cuts_at_token_counts(tmp_path: Path) -> None:
    counter = HFTokenizerCounter.from_file(_tiny_tokenizer(tmp_path))
    w = build(WorkloadSpec(prefix_tokens=500, turns=2, conversations=1, user_tokens=40, tool_tokens=80), counter)
    conv = w.conversations[0]
    assert conv.system is not None
    # Cutting at a token boundary and re-encoding may merge across the cut: allow one token.
    assert abs(counter.count(conv.system) - 500) <= 1
    assert abs(conv.turns[0].tokens - 40) <= 1
    # With a byte-level BPE the same text is not one token per word: sizing really used the tokenizer.
    assert WordCounter().count(conv.system) != counter.count(conv.system)
