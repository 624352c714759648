"""The swapped cache: proof that a decode reads its cache, which only reading it can give.

Right after the student's `prefill` (or the j-th `attn_step`) returns, the grader has the K/V
in its cache replaced (found by content, whatever the layout, in what the student's process
sends: swap_search.py; the prompt's K/V never leave the grader) and asks for the answer over
what the cache then holds. What it is given are the keys of one random prompt and the values of
another, of the same length, in every layer: no sequence of tokens has that cache, so no
recompute from token ids, kept or reconstructed, can produce the answer; only attention over
the cache it holds can. The answer is the oracle's, fixed before the call, and nothing the
student's process reports decides a pass.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from theinference.curriculum.checks.swap_search import Search
from theinference.oracle import gpt2 as oracle
from theinference.oracle.gpt2 import LayerKV
from theinference.student.worker.protocol import SWAP_PLAN


@dataclass
class SwapPlan:
    """When to swap (the `at_call`-th return of `hook`), what the cache holds then (`finds`,
    per layer), what it holds after (`writes`), and the answer over that (`expected`). Only
    the plan's sizes reach the student's process; the K/V are searched for here
    (swap_search.py) in what it sends, and the writes go only to where they were found."""

    hook: str
    at_call: int
    finds: list[LayerKV]
    writes: list[LayerKV]
    expected: np.ndarray | None  # None where it depends on the answer (`along`)
    plain: Callable[[], np.ndarray | None]  # the answer had nothing been swapped (the message)
    # a generation's: the logits over the swapped cache along the student's own tokens
    along: Callable[[list[int]], np.ndarray] | None = None
    # where a floor is the fallback: PATIENCE (searches, see there), and MOMENTS looked at
    patience: int | None = None
    most: int = 0  # the most rows one search has found
    stale: int = 0  # searches since it last found more
    calls: int = 0  # the hook's returns in this call, as far as the grader has heard
    offered: bool = field(default=False)
    sent: bool = field(default=False)  # the writes went out: the grader's fact, not the student's
    searched: str = field(default="")  # why the last search found no cache (for the message)
    search: Search | None = field(default=None, repr=False)

    def answer(self, word: dict) -> tuple[dict, list[bytes]]:
        """The grader's answer to a hook's word: to its first return (then after the call this
        answer names), the swap's sizes once, or when to ask again; to what the process holds
        at a moment after that, the rows to write, or why there are none."""
        if "held" in word:
            return self.answer_held(word)
        call = word.get("call")
        self.calls = max(self.calls, call if isinstance(call, int) else self.calls + 1)
        if self.offered or self.calls < self.at_call:
            return {"swap": None, "next": None if self.offered else self.at_call}, []
        self.offered = True
        h, n, hd = self.finds[0].k.shape
        return {"swap": offered(len(self.finds), h, hd, n, self.patience), "next": None}, []

    def answer_held(self, word: dict) -> tuple[dict, list[bytes]]:
        if self.sent or not self.offered:  # one swap a call, and only once it was offered
            return {"write": None, "reason": "no swap is due now"}, []
        if self.search is None:
            self.search = Search(self.finds, self.writes)
        about = word.get("about") if isinstance(word.get("about"), str) else "what was sent"
        try:
            answer, blobs = self.search.answer(word["held"], about[:2000])
        except Exception as exc:  # noqa: BLE001 (what the student's process sent is theirs)
            answer, blobs = {"write": None, "reason": f"the grader's search failed: {exc!r}"}, []
        self.sent = answer["write"] is not None
        self.searched = "" if self.sent else answer["reason"]
        if not self.sent and self.gives_up(self.search.found):
            answer["stop"] = True
        return answer, blobs

    def gives_up(self, found: int) -> bool:
        """Whether the search ends here: `patience` searches in a row found no more rows."""
        self.stale = 0 if found > self.most else self.stale + 1
        self.most = max(self.most, found)
        return self.patience is not None and self.stale >= self.patience


def offered(layers: int, h: int, hd: int, n: int, patience: int | None) -> dict:
    """The swap's sizes as the student's process is told them; where a floor is the fallback
    (`patience`), with the moments its watch looks at, bounded."""
    plan = dict(zip(SWAP_PLAN, (layers, h, hd, n), strict=True))
    return plan | ({"moments": MOMENTS[0] + MOMENTS[1] * n} if patience is not None else {})


# where a floor is the fallback, the moments a watch looks at, as (512 + 4 a prompt row: a
# prefill under another name returns once a row embedding it, a few times a layer), and the
# searches in a row finding no more rows after which the grader looks no more (a cache being
# built shows more every layer; a recompute's layers come and go)
MOMENTS, PATIENCE = (512, 4), 32


def random_ids(count: int, seed: int, vocab: int) -> list[int]:
    # PCG64's raw stream, as the stage specs' `{ random = N, seed = S }`
    raw = np.random.PCG64(seed).random_raw(count)
    return [int(x) for x in raw % np.uint64(vocab)]


def shuffled_cache(kv: list[LayerKV], seed: int) -> list[LayerKV]:
    """The prompt's own K/V with some layers' replaced so that no token sequence has them: in
    each of a few layers (1 to half of them, drawn), the keys are another layer's and the
    values a third's, each with its positions in an order of its own. Which layers, whence
    and in what order are the seed's, kept from the student's process: the answer over this
    cache can be had only by reading it, and a decode that checks a row or a layer of its
    cache against its own recompute, to read the cache only when it finds it swapped, most
    often finds nothing changed where it looks."""
    rng = np.random.Generator(np.random.PCG64(seed))
    layers, n = len(kv), kv[0].k.shape[1]
    out = list(kv)
    for layer in rng.choice(layers, size=1 + int(rng.integers(max(layers // 2, 1))), replace=False):
        keys, values = (another(int(layer), layers, rng) for _ in range(2))
        out[layer] = LayerKV(
            k=kv[keys].k[:, rng.permutation(n)], v=kv[values].v[:, rng.permutation(n)]
        )
    if layers == 1:  # no other layer to take from: the keys and values trade places
        out[0] = LayerKV(k=kv[0].v[:, rng.permutation(n)], v=kv[0].k[:, rng.permutation(n)])
    return out


def another(layer: int, layers: int, rng: np.random.Generator) -> int:
    """A layer other than `layer`, drawn (itself when it is the only one)."""
    return (layer + 1 + int(rng.integers(layers - 1))) % layers if layers > 1 else layer


def prompt_state(recompute, prompt: list[int], new_ids: list[int]):
    """(the prompt's K/V per layer, each [h, n, hd]; the logits of each of `new_ids` decoded
    after it, [len(new_ids), vocab]): one forward over prompt + new_ids (a causal forward's
    first rows are the prompt's K/V). It depends on the weights and the case alone, so the
    grader keeps it across runs (grading/answers.py); only the swap is drawn per run."""
    n = len(prompt)
    if not new_ids:  # the K/V alone: a remembered forward's first rows, where one begins so
        return recompute.kv_of(prompt), np.zeros((0, recompute.config.vocab_size), np.float32)
    whole = recompute.forward(prompt + new_ids)
    finds = [LayerKV(k=layer.k[:, :n], v=layer.v[:, :n]) for layer in whole.kv]
    return finds, oracle.logits_at(whole.hidden, recompute.w, list(range(n, n + len(new_ids))))


def prompt_kv_and_logits(recompute, prompt: list[int], state) -> tuple[list, np.ndarray]:
    """(the prompt's K/V per layer, [h, n, hd] each; its last position's logits, [vocab]),
    through `state` (swap.prompt_state, or the K/V the grader keeps)."""
    if len(prompt) == 1:
        f = recompute.forward(prompt)
        return f.kv, oracle.logits_at(f.hidden, recompute.w, [0])[0]
    _, last = state(recompute, prompt[:-1], prompt[-1:])  # the last row decoded: its logits
    finds, _ = state(recompute, prompt, [])  # the same forward (Recompute keeps it), or kept
    return finds, last[0]


def after_prefill(recompute, prompt: list[int], new_ids: list[int], seed: int,
                  state=prompt_state) -> SwapPlan:
    """The model cache swapped right after the prompt's prefill for its own K/V, some layers
    shuffled across layers and positions (shuffled_cache); expected: the logits of each of
    `new_ids` decoded after it ([len(new_ids), vocab]), one decode over the swapped K/V.
    `state(recompute, prompt, new_ids)` gives the prompt's K/V and the answer had nothing been
    swapped (prompt_state, or the same kept)."""
    w, layers, n = recompute.w, recompute.config.n_layer, len(prompt)
    finds, plain = state(recompute, prompt, new_ids)
    for attempt in range(REDRAWS):
        writes = shuffled_cache(finds, seed + attempt)
        decoded = oracle.extend(new_ids, w, layers, writes, start=n)
        expected = oracle.logits_at(decoded.hidden, w, list(range(len(new_ids))))
        if not np.allclose(expected, plain, **APART):
            break
    return SwapPlan("prefill", 1, finds, writes, expected, lambda: plain)


# a swapped cache whose answer lies this near the original's is drawn again: a recompute must
# never pass for it (several times the stages' own tolerance for logits)
APART = {"atol": 0.01, "rtol": 0.05}
REDRAWS = 8


def after_attn_step(recompute, seq: list[int], seed: int, state=None) -> SwapPlan:
    """Layer 0's cache swapped after the j-th attn_step (j from the seed, 1..n-1): the rows
    0..j-1; expected: the last row's attention sublayer after the rest walked over it ([d]).
    Layer 0 alone is cheap: nothing is kept (`state` unused)."""
    w, vocab = recompute.w, recompute.config.vocab_size
    j = 1 + seed % (len(seq) - 1)
    x = oracle.embed(seq, w)  # [n, d]
    _, finds = oracle.attn_sublayer(x[:j], w, 0)
    _, keys = oracle.attn_sublayer(oracle.embed(random_ids(j, seed, vocab), w), w, 0)
    _, values = oracle.attn_sublayer(oracle.embed(random_ids(j, seed + 1, vocab), w), w, 0)
    writes = LayerKV(k=keys.k, v=values.v)
    out, _ = oracle.attn_sublayer(x[j:], w, 0, past=writes)

    def plain() -> np.ndarray:
        return recompute.layer0_attention_last(seq)

    return SwapPlan("attn_step", j, [finds], [writes], out[-1], plain)


# said by every stage with a swap; each stage's TOML gives its {hook}, {what} and {keep}
FOLLOWED = (
    "the answer followed the cache: with its K/V swapped, right after {hook} returned, for keys "
    "and values that no token sequence has, it was the answer over that cache"
)
CANNOT_SWAP = (
    "the grader could not swap the cache's K/V ({why}), so it cannot tell that the {what} reads "
    "its cache, and a check that cannot apply does not pass. {keep}"
)
# an answer neither over the swapped cache nor the original's: the grader asks the case again
# over the student's own cache (judging.asked_unswapped), whose verdict replaces this one
ASK_AGAIN = "departs over the swapped cache: to be asked again over the student's own cache"
@dataclass(frozen=True)
class Seen:
    """What a swap case's judge gets beside the value: the plan, the hook's own report (the
    student's process wrote it: read for the message only, never for a pass), and whether
    this is the case asked again unswapped, to name the bug of an answer that departs."""

    plan: SwapPlan
    report: dict | None
    rerun: bool = False

    @property
    def applied(self) -> bool:
        """The grader sent the writes and the process did not say it failed to make them: a
        process that says it did without being sent any is not believed, and a pass still
        rests on the answer alone (swap_verdict)."""
        swap = (self.report or {}).get("swap")
        said = isinstance(swap, dict) and swap.get("applied") is True
        return not self.rerun and self.plan is not None and self.plan.sent and said


def judged(seen: Seen, swapped: Callable[[], object], plain: Callable[[], object], say):
    """A swapped case's verdict: over the swapped cache where the swap applied; else the
    answer over the student's own cache, which passes nothing by itself: a correct answer
    the grader could not swap under proves no cache use and fails, saying what was found."""
    from theinference.curriculum.checks.common import Verdict
    from theinference.results import Status

    if seen.applied:
        return swapped()
    verdict = plain()
    if seen.rerun or verdict.status != Status.PASSED:
        return verdict
    words = {"what": say("what"), "keep": say("keep"), "why": not_applied(seen.plan, seen.report)}
    return Verdict(Status.FAILED, message=CANNOT_SWAP.format(**words))


def swap_verdict(returned, seen: Seen, as_array: Callable, say, tol, label: str):
    """Passed only when the answer is the oracle's over the swapped cache; else a failure that
    says whether the answer ignored the swap or departs from both."""
    from theinference.curriculum.checks.common import Rejected, Verdict
    from theinference.results import Status
    from theinference.results.compare import OVER_SWAPPED, compare

    plan = seen.plan
    try:
        actual = as_array(returned)
    except Rejected as exc:
        return Verdict(Status.FAILED, message=f"over the swapped cache: {exc}")
    expected = plan.expected.reshape(actual.shape)
    c = compare(label + OVER_SWAPPED, actual, expected, tol, logits=label == "logits")
    if c.passed:
        return Verdict(Status.PASSED, message=FOLLOWED.format(hook=say("hook")), comparisons=[c])
    unswapped = compare(label, actual, plan.plain().reshape(actual.shape), tol)
    if unswapped.passed:
        return Verdict(
            Status.FAILED,
            message=say("recomputes"),
            hint=say("reads_cache"),
            comparisons=[c],
            # the table's words are a decode's: attention over its own cache has none of its own
            suspected_bug="decode-recomputes" if plan.hook == "prefill" else None,
        )
    return Verdict(Status.FAILED, message=ASK_AGAIN, comparisons=[c])


def departs(verdict) -> bool:
    """A failure over the swapped cache that is neither the original answer nor a rejected
    value: worth asking again unswapped, where the stage's diagnosis can name the bug."""
    return verdict.message == ASK_AGAIN


def not_applied(plan: SwapPlan, report: dict | None) -> str:
    """Why the swap never happened, or "" when the student's process says it did."""
    report = report or {}
    watched = report.get("watch") == "returns"
    if not watched and not report.get("found"):
        return f"no function named {plan.hook} was found in the course's modules"
    if plan.calls < plan.at_call:
        if watched:
            return (
                "no function returned into the adapter (or into a course function it called) "
                "during the call, so there was no moment after the prompt's prefill to swap at"
            )
        return f"{plan.hook} returned {plan.calls} time(s) during the call, fewer than needed"
    swap = report.get("swap")
    if plan.searched:  # the grader's own search: what it found missing
        return plan.searched
    if not isinstance(swap, dict):
        return f"the swap after {plan.hook} was not acknowledged"
    return "" if swap.get("applied") else str(swap.get("reason", "the K/V were not found"))
