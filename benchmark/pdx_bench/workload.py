"""An agent-like multi-turn workload, generated deterministically from a seed (pure).

Every conversation starts from a long system prompt (the "prefix"; shared by all
conversations, like an agent's instructions and tool catalogue) and grows by one user turn
per request: from the second turn on, the user message carries the result of the tool the
assistant "called" plus the next instruction, and the assistant's streamed answer is
appended by the client. That is the traffic shape where reading a finished turn's KV back
from decode pays off: each turn re-sends everything before it.

Texts are sized in tokens. Without a tokenizer a token is approximated by a word; with one
(the served model's ``tokenizer.json``) texts are cut at exact token counts. Either way the
records carry the engine's own ``usage.prompt_tokens``, so the approximation only shapes
the workload, never the numbers reported.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

# A fixed, boring vocabulary: common English words keep BPE token counts near one per word.
_WORDS_TEXT = (
    "the of and to in is for on with as by at from that this it be are was or an not which have "
    "has had can will would should could may might must file line value result error output input "
    "function call tool agent step plan task user system data table query search read write list "
    "open close path name type field record request response server client model token cache block "
    "turn time memory disk node engine batch queue test check run build deploy config option flag "
    "number string object array index key map set get put add remove update create delete start stop "
    "first last next previous new old small large fast slow high low good bad true false none empty "
    "status state event log metric trace span graph edge vertex route store fetch parse render format "
    "report summary detail note comment issue change patch branch commit merge review source target"
)
_WORDS = tuple(_WORDS_TEXT.split())

_TOOLS = ("search_docs", "read_file", "run_tests", "query_db", "list_dir", "http_get", "grep_code")


class TokenCounter(Protocol):
    """How texts are sized: count tokens, and cut a text to at most n tokens."""

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, n: int) -> str: ...


class WordCounter:
    """One token per whitespace-separated word: the tokenizer-free approximation."""

    def count(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, n: int) -> str:
        return " ".join(text.split()[:n])


class HFTokenizerCounter:
    """Exact sizing with a `tokenizers` tokenizer (e.g. the local model's tokenizer.json)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    @classmethod
    def from_file(cls, path: Path) -> HFTokenizerCounter:
        from tokenizers import Tokenizer

        p = path / "tokenizer.json" if path.is_dir() else path
        return cls(Tokenizer.from_file(str(p)))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, n: int) -> str:
        enc = self._tok.encode(text, add_special_tokens=False)
        if len(enc.ids) <= n:
            return text
        if n <= 0:
            return ""
        return text[: enc.offsets[n - 1][1]]


@dataclass(frozen=True)
class SuffixBucket:
    """Follow-up turns of `low` up to `high` new tokens (log-uniform between), drawn with
    probability `weight` (the weights of a mix are normalized)."""

    low: int
    high: int
    weight: float

    @property
    def label(self) -> str:
        return f"{self.low}-{self.high}"


@dataclass(frozen=True)
class SuffixMix:
    """Each follow-up turn's new tokens drawn from a stated distribution: a bucket by weight, then
    a size log-uniform within it. The draw depends only on the seed, the prefix length, the
    conversation and the turn: OFF, ON and the bound send turns of the same sizes."""

    name: str
    buckets: tuple[SuffixBucket, ...]

    def __post_init__(self) -> None:
        if not self.buckets:
            raise ValueError("a suffix mix needs at least one bucket")
        for b in self.buckets:
            if not 1 <= b.low < b.high or b.weight <= 0:
                raise ValueError(f"suffix bucket {b.label}:{b.weight:g}: expected 1 <= LO < HI and a weight > 0")
        for a, b in zip(self.buckets, self.buckets[1:], strict=False):
            if b.low < a.high:
                raise ValueError(f"suffix buckets {a.label} and {b.label} overlap: list them in order, apart")

    @classmethod
    def parse(cls, text: str) -> SuffixMix:
        """`agentic`, or `LO-HI:WEIGHT,LO-HI:WEIGHT,...` (tokens; weights need not sum to 1)."""
        if text.strip() in NAMED_MIXES:
            return NAMED_MIXES[text.strip()]
        buckets = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            rng, colon, weight = part.partition(":")
            low, dash, high = rng.partition("-")
            try:
                if not (colon and dash):
                    raise ValueError
                buckets.append(SuffixBucket(int(low), int(high), float(weight)))
            except ValueError:
                raise ValueError(
                    f"suffix mix: expected {'|'.join(NAMED_MIXES)} or LO-HI:WEIGHT,..., got {part!r}"
                ) from None
        return cls(text.strip(), tuple(buckets))

    def draw(self, rng: random.Random) -> int:
        total = sum(b.weight for b in self.buckets)
        pick, bucket = rng.random() * total, self.buckets[-1]
        for b in self.buckets:
            if pick < b.weight:
                bucket = b
                break
            pick -= b.weight
        size = math.exp(rng.uniform(math.log(bucket.low), math.log(bucket.high)))
        return min(bucket.high - 1, max(bucket.low, int(size)))

    def bucket_of(self, tokens: int) -> SuffixBucket | None:
        """The bucket a size was drawn from (low inclusive, high exclusive)."""
        return next((b for b in self.buckets if b.low <= tokens < b.high), None)

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1].high - 1

    def describe(self) -> str:
        """e.g. `100-512 tokens 55%, 512-1024 20%, ...` (log-uniform within each)."""
        total = sum(b.weight for b in self.buckets)
        parts = [f"{b.label} {100 * b.weight / total:.0f}%" for b in self.buckets]
        return f"{self.name}: " + ", ".join(parts) + " (tokens per follow-up turn, log-uniform within a bucket)"


# An agent's follow-up turns: mostly short (an instruction, a short tool output, below the GPU
# default decodeLocalMaxTokens of 1024), a long tail of tool results (a file, a retrieved
# document, test output) of thousands of tokens that take the D->P read.
AGENTIC = SuffixMix(
    "agentic",
    (
        SuffixBucket(100, 512, 0.55),
        SuffixBucket(512, 1024, 0.20),
        SuffixBucket(1024, 4096, 0.15),
        SuffixBucket(4096, 8192, 0.10),
    ),
)
NAMED_MIXES = {"agentic": AGENTIC}


def turn_suffixes(seed: int, prefix_tokens: int, conversation: int, turns: int, mix: SuffixMix) -> list[int]:
    """The new tokens of turns 2..`turns` of one conversation under a mix (deterministic)."""
    rng = random.Random(f"{seed}:suffix:{mix.name}:{prefix_tokens}:{conversation}")
    return [mix.draw(rng) for _ in range(turns - 1)]


@dataclass(frozen=True)
class WorkloadSpec:
    """The knobs of one workload; `prefix_tokens` is what a sweep varies."""

    prefix_tokens: int = 2000
    turns: int = 4
    conversations: int = 3
    user_tokens: int = 64
    tool_tokens: int = 192
    output_tokens: int = 32
    concurrency: int = 1
    request_rate: float = 0.0  # requests/s over all clients (Poisson); 0: as fast as answers come
    think_time_s: float = 0.0  # pause between a turn's answer and the next turn of that conversation
    stagger_s: float = 0.0  # client i starts its first request i x this late, so conversations interleave
    seed: int = 0
    shared_prefix: bool = True  # one system prompt for all conversations (an agent's instructions)
    system_role: bool = True  # False: fold the prefix into the first user turn (vLLM's benchmark format)
    fixed_output: bool = True  # send min_tokens = max_tokens so history grows by the same amount each turn
    # Other texts of the same sizes: a leg on an engine that may still cache another leg's
    # prompts (the bound, on the ON leg's decode) must not find its own suffix there.
    text_salt: str = ""
    # Each follow-up turn's new tokens drawn from this distribution (the instruction, at most
    # user_tokens and half, after a tool result of the rest); None: user_tokens + tool_tokens.
    suffix_mix: SuffixMix | None = None

    def __post_init__(self) -> None:
        for name in ("prefix_tokens", "user_tokens", "tool_tokens", "output_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("turns", "conversations", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.output_tokens < 1:
            raise ValueError("output_tokens must be >= 1")
        if self.request_rate < 0 or self.think_time_s < 0 or self.stagger_s < 0:
            raise ValueError("request_rate, think_time_s and stagger_s must be >= 0")

    def with_prefix(self, prefix_tokens: int) -> WorkloadSpec:
        return replace(self, prefix_tokens=prefix_tokens)

    def with_new_tokens(self, new_tokens: int) -> WorkloadSpec:
        """Follow-up turns of `new_tokens` new tokens: the instruction (at most half of them)
        after a tool result of the rest; what decode lacks of a turn is these plus the template's."""
        user = min(self.user_tokens, new_tokens // 2)
        return replace(self, user_tokens=user, tool_tokens=new_tokens - user)

    def live(self, conversations: int) -> WorkloadSpec:
        """`conversations` live at once: one client each, their starts spread over one think time
        (client i starts i/n of it late), so their turns interleave as agents' do."""
        stagger = self.think_time_s / conversations
        return replace(self, conversations=conversations, concurrency=conversations, stagger_s=stagger)

    def last_turn_tokens(self, template_overhead: int = 16) -> int:
        """Estimated prompt size of the last turn, to check against max-model-len up front (under
        a suffix mix, of the conversation whose drawn suffixes add up to most)."""
        if self.suffix_mix is not None:
            drawn = max(
                sum(turn_suffixes(self.seed, self.prefix_tokens, c, self.turns, self.suffix_mix))
                for c in range(self.conversations)
            )
            per_turn = self.output_tokens + 2 * template_overhead
            return self.prefix_tokens + min(self.user_tokens, 64) + drawn + self.turns * per_turn + template_overhead
        per_turn = self.user_tokens + self.output_tokens + template_overhead
        tools = (self.turns - 1) * self.tool_tokens
        return self.prefix_tokens + self.turns * per_turn + tools + template_overhead


@dataclass(frozen=True)
class Turn:
    """One user message of a conversation; `index` counts from 1."""

    index: int
    content: str
    tokens: int  # by the workload's counter (words or the tokenizer), not the engine's
    new_tokens: int | None = None  # under a suffix mix: the size drawn for this follow-up turn


@dataclass(frozen=True)
class Conversation:
    """A planned conversation: the assistant's answers are filled in by the client as it runs."""

    conversation_id: str
    system: str | None
    turns: tuple[Turn, ...]
    max_tokens: int
    min_tokens: int | None

    def messages_for(self, turn: int, answers: list[str]) -> list[dict[str, str]]:
        """The chat messages of turn `turn` (1-based) given the answers of the turns before it."""
        if len(answers) < turn - 1:
            raise ValueError(f"turn {turn} needs {turn - 1} answers, got {len(answers)}")
        out: list[dict[str, str]] = []
        if self.system is not None:
            out.append({"role": "system", "content": self.system})
        for i in range(turn):
            out.append({"role": "user", "content": self.turns[i].content})
            if i < turn - 1:
                out.append({"role": "assistant", "content": answers[i]})
        return out


@dataclass
class Workload:
    """A spec expanded into conversations, plus the arrival schedule's random stream."""

    spec: WorkloadSpec
    conversations: list[Conversation] = field(default_factory=list)
    label: str = ""

    def arrival_gaps(self) -> list[float]:
        """Seconds between request starts for a Poisson arrival process (empty when unpaced)."""
        if self.spec.request_rate <= 0:
            return []
        rng = random.Random(f"{self.spec.seed}:arrivals:{self.spec.prefix_tokens}")
        n = self.spec.turns * self.spec.conversations
        return [rng.expovariate(self.spec.request_rate) for _ in range(n)]

    @property
    def num_requests(self) -> int:
        return self.spec.turns * self.spec.conversations


def _text(rng: random.Random, n: int, counter: TokenCounter, lead: str = "") -> str:
    """About n tokens of sentence-like filler, cut exactly at n when the counter can."""
    if n <= 0:
        return lead.strip()
    words: list[str] = [lead] if lead else []
    text = lead
    # Grow in chunks until the counter says we have enough, then cut.
    while counter.count(text) < n:
        chunk = [rng.choice(_WORDS) for _ in range(max(8, n // 2))]
        for j in range(11, len(chunk), 12):
            chunk[j] += "."
        words.extend(chunk)
        text = " ".join(words)
    return counter.truncate(text, n)


def filler(seed: str, n: int, counter: TokenCounter, lead: str = "") -> str:
    """`lead`, then sentence-like filler up to n tokens, the same for the same seed."""
    return _text(random.Random(seed), n, counter, lead)


def build(spec: WorkloadSpec, counter: TokenCounter | None = None, label: str = "w") -> Workload:
    """Expand a spec into conversations.

    Texts depend only on the spec and the counter, so the OFF and ON legs of a sweep send the
    same prompts; `label` only names the conversations (give each leg and run its own, so a
    router that outlives a leg never mistakes them for the previous leg's).
    """
    counter = counter or WordCounter()
    seed = f"{spec.seed}{spec.text_salt}"
    rng = random.Random(f"{seed}:{spec.prefix_tokens}")
    shared = _system_prompt(random.Random(f"{seed}:system:{spec.prefix_tokens}"), spec.prefix_tokens, counter)
    convs: list[Conversation] = []
    for c in range(spec.conversations):
        conv_id = f"{label}-s{spec.seed}-p{spec.prefix_tokens}-c{c}"
        system = shared if spec.shared_prefix else _system_prompt(rng, spec.prefix_tokens, counter, c)
        mix = spec.suffix_mix
        drawn = turn_suffixes(spec.seed, spec.prefix_tokens, c, spec.turns, mix) if mix is not None else []
        turns: list[Turn] = []
        for t in range(1, spec.turns + 1):
            new = drawn[t - 2] if t > 1 and mix is not None else None
            user, tool_tokens = spec.user_tokens, spec.tool_tokens
            if new is not None:
                user = min(spec.user_tokens, new // 2)
                tool_tokens = new - user
            ask = _text(rng, user, counter, lead=f"Step {t} of task {c}:")
            if t > 1:
                tool = rng.choice(_TOOLS)
                result = _text(rng, tool_tokens, counter, lead=f"Result of {tool}:")
                content = f"{result}\n\n{ask}"
            else:
                content = ask
            turns.append(Turn(index=t, content=content, tokens=counter.count(content), new_tokens=new))
        if not spec.system_role:
            first = turns[0]
            merged = f"{system}\n\n{first.content}"
            turns[0] = Turn(index=1, content=merged, tokens=counter.count(merged))
            system_msg: str | None = None
        else:
            system_msg = system
        convs.append(
            Conversation(
                conversation_id=conv_id,
                system=system_msg,
                turns=tuple(turns),
                max_tokens=spec.output_tokens,
                min_tokens=spec.output_tokens if spec.fixed_output else None,
            )
        )
    return Workload(spec=spec, conversations=convs, label=label)


def _system_prompt(rng: random.Random, n: int, counter: TokenCounter, variant: int | None = None) -> str:
    tools = ", ".join(_TOOLS)
    who = f" (workspace {variant})" if variant is not None else ""
    lead = f"You are a coding agent{who}. Tools: {tools}. Follow the rules below."
    return _text(rng, n, counter, lead=lead)


def to_vllm_conversations(workload: Workload, placeholder_answer: str = "ok") -> list[dict[str, Any]]:
    """The workload as the input file of vLLM's multi-turn benchmark (a list of {id, messages}).

    That tool wants strictly alternating user/assistant messages starting with a user turn, so
    the system prompt must already be folded into the first user turn (`system_role=False`).
    Assistant contents are placeholders: the benchmark replaces them with the live answers.
    """
    out: list[dict[str, Any]] = []
    for conv in workload.conversations:
        if conv.system is not None:
            raise ValueError("vLLM's multi-turn benchmark has no system role: build with system_role=False")
        msgs: list[dict[str, str]] = []
        for turn in conv.turns:
            msgs.append({"role": "user", "content": turn.content})
            msgs.append({"role": "assistant", "content": placeholder_answer})
        out.append({"id": conv.conversation_id, "messages": msgs})
    return out
