"""Helpers the tests share: course directories from the real template, grading as the CLI does."""

import importlib.util
from dataclasses import replace
from pathlib import Path

SOLUTIONS = Path(__file__).parent / "solutions"


def installed(module: str) -> bool:
    """Whether `module` can be imported here, found without importing it (collection must
    not need torch: the tests that do skip where it is absent)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def make_course(root: Path, kvcache: str | None = None) -> Path:
    from theinference.course.directory import init_course

    init_course(root)
    if kvcache is not None:
        (root / "src" / "kvcache.py").write_text(kvcache)
    return root


def with_template_stubs(kvcache: str, template_dir: Path | None = None) -> str:
    """A solution's src/kvcache.py with a stub for each function the template's adapters
    import and it does not define, raising as the template's stub does: a layout that
    implements only some stages (one added after it) still imports, and is `todo` on the
    others alone. `template_dir`: the Python template's, else the package's."""
    import ast

    from theinference.course.directory import TEMPLATE_DIR

    template_dir = template_dir or TEMPLATE_DIR
    adapters = ast.parse((template_dir / "tests" / "adapters.py").read_text())
    wanted = top_level_names(adapters) - top_level_names(ast.parse(kvcache))
    template = ast.parse((template_dir / "src" / "kvcache.py").read_text())
    stubs = [
        f"\n\ndef {node.name}(*args, **kwargs):\n    raise NotImplementedError({message!r})\n"
        for node in template.body
        if getattr(node, "name", None) in wanted and (message := stub_message(node))
    ]
    return kvcache + "".join(stubs)


def top_level_names(module) -> set[str]:
    """What a module defines at its top: functions, classes, assignments and imports."""
    import ast

    names = set()
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def stub_message(node) -> str | None:
    """The message a template stub raises NotImplementedError with (None: not a stub)."""
    import ast

    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "NotImplementedError"
                and call.args and isinstance(call.args[0], ast.Constant)):
            return call.args[0].value
    return None


def reference_text() -> str:
    return (SOLUTIONS / "reference_kvcache.py").read_text()


def grade_course(
    course: Path,
    weights,
    slugs: list[str] | None = None,
    timeout: float = 60,
    oracle=None,
    listener=None,
    seed: int | None = None,
    quick: bool = False,
):
    """Grade through the same path as the CLI, returning the RunResult (`oracle`: the answers
    to share, `seed`: the drawn cases', as the `answers` and `run_seed` fixtures give them;
    `quick`: the long cases left out, as --quick does)."""
    from theinference.curriculum.stages import load_stages, select
    from theinference.grading.grader import RunPlan, grade
    from theinference.grading.policy import RunPolicy
    from theinference.student.setup import Limits, ProcessSetup

    stages = [replace(s, timeout=timeout) for s in select(load_stages(), slugs or [])]
    from theinference.results.events import ignore

    return grade(ProcessSetup(course, weights.path, Limits(timeout=timeout)),
                 RunPlan(stages, weights, oracle, RunPolicy(quick=quick), seed=seed),
                 listener or ignore)


def statuses(run) -> dict[str, str]:
    return {s.slug: s.status.value for s in run.stages}


def stage_slugs() -> list[str]:
    """Every stage's slug, in course order, as the registry has them (a stage added there is
    graded by every test that grades them all, with no list here to add it to)."""
    from theinference.curriculum.stages import load_stages

    return [stage.slug for stage in load_stages()]


STAGES = stage_slugs()


def alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for a reaper (PID 1 here may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def hf_gpt2(weights, torch, transformers):
    """Hugging Face transformers' GPT2LMHeadModel holding these weights (an independent GPT-2)."""
    import numpy as np

    c = weights.config
    config = transformers.GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.n_ctx,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    state = {f"transformer.{k}": torch.from_numpy(np.array(v)) for k, v in weights.tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected
    assert all(
        k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias")) for k in missing
    ), missing
    model.tie_weights()
    return model


def oracle_answer(check: str, args: list, w: dict, n_layer: int):
    """The grader's answer to a case of a numeric check, by full recompute (no cache)."""
    from theinference.oracle import gpt2 as oracle

    if check == "step_attention":
        return oracle.attn_sublayer(oracle.embed(args[0], w), w, 0)[0][-1]
    prompt = args[0]
    if check == "prefill_logits":
        return oracle.recompute_logits(prompt, w, n_layer)[-1]
    if check == "decode_step":
        return oracle.recompute_logits(prompt + [args[1]], w, n_layer)[-1]
    return oracle.recompute_logits(prompt + args[1], w, n_layer)[len(prompt) :]


def swap_in_process(roots: list, weights, finds: list, writes: list) -> dict:
    """One swap of the K/V `finds` (per layer LayerKV) for `writes` among what `roots` reach,
    both sides in this process (grader_exchange): the Target's report."""
    from theinference.student.worker import swap as worker_swap

    return worker_swap.Target(sizes(finds), grader_exchange(finds, writes)).swap(roots, weights)


def sizes(finds: list) -> dict:
    """The plan a worker is sent for these K/V: their sizes alone."""
    h, n, hd = finds[0].k.shape
    return {"layers": len(finds), "heads": h, "head_dim": hd, "n": n}


def grader_exchange(finds: list, writes: list, heard: list | None = None):
    """The grader's side of a swap, in this process: what a worker's Target sends, read back
    as the grader reads a hook's word (reply_arrays.held_arrays, each array's size added to
    `heard`), searched by the grader's Search."""
    from theinference.curriculum.checks.swap_search import Search
    from theinference.student.reply_arrays import Blobs, Known, held_arrays

    search = Search(finds, writes)

    def exchange(word: dict, blobs=()):
        held = held_arrays(word["probe"]["held"], Blobs(blobs))
        if heard is not None:  # the arrays whose bytes were sent (not those named Known)
            heard.extend(s.array.size for s in held if not isinstance(s, Known))
        return search.answer(held, word["probe"]["about"])

    return exchange


def slowed_plans(monkeypatch, adapter: str, seconds: float) -> tuple[list, list]:
    """(when each swap plan was made, when each call of `adapter` began), the oracle's planner
    slowed by `seconds` a plan: whether a call begins before its plan is made."""
    import time

    from theinference.grading import ahead
    from theinference.student.process import StudentProcess

    made_at, began_at = [], []
    timed_plan, call = ahead.timed_plan, StudentProcess.call

    def slow_plan(*args):
        time.sleep(seconds)
        made = timed_plan(*args)
        made_at.append(time.monotonic())
        return made

    def timed_call(self, called, *args, **named):
        if called == adapter:
            began_at.append(time.monotonic())
        return call(self, called, *args, **named)

    monkeypatch.setattr(ahead, "timed_plan", slow_plan)
    monkeypatch.setattr(StudentProcess, "call", timed_call)
    return made_at, began_at
