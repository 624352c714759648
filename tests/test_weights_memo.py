"""The weights' digests kept between runs: a warm run reads no tensor until the oracle needs one,
and nothing but the grader's own memo, over the very bytes it hashed, can spare the read."""

import types
from pathlib import Path

import numpy as np
import pytest

from theinference.grading.digests import MEMO_FILE, SignedDigests
from theinference.grading.session import digest_memo
from theinference.oracle import private_copy
from theinference.oracle import weights as weights_module
from theinference.oracle.checkpoint import WeightsError
from theinference.oracle.config import ModelConfig, expected_shapes

SMALL = ModelConfig(n_layer=2, n_embd=128, vocab_size=300, n_ctx=32)


def small_file(folder: Path) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    tensors = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in expected_shapes(SMALL).items()}
    path = folder / "m.safetensors"
    save_file(tensors, str(path))
    return path


def fresh_load(path: Path, memo):
    """A load as a new grader process makes it: nothing held from an earlier read."""
    private_copy._LAST_READ.clear()
    return weights_module.load_weights(str(path), path.parent, memo=memo)


def tamper(path: Path, offset: int, data: bytes) -> None:
    """A write in place with the times put back: what a process owning the file can do."""
    import os

    st = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_file_the_memo_knows_is_read_only_when_the_oracle_first_needs_it(tmp_path):
    """Would catch a warm run still reading and hashing 500 MB up front (the memo unused), or
    a lazy read handing the oracle other bytes than the first load's."""
    path, memo = small_file(tmp_path), SignedDigests(tmp_path / "cache")
    first = fresh_load(path, memo)
    assert first.tensors.read  # nothing known yet: read and hashed, and the digest learned
    # ... the file's alone: a run in a fresh cache reads the bytes once and hashes them once
    assert memo.known(private_copy.stat_key(path))["parts"] == {}
    ln_f = np.array(first.tensors["ln_f.weight"])
    second = fresh_load(path, memo)
    assert not second.tensors.read and second.sha256 == first.sha256
    assert second.config == first.config
    assert np.array_equal(second.tensors["ln_f.weight"], ln_f) and second.tensors.read


def test_bytes_changed_after_the_memo_vouched_for_them_end_the_run_with_an_error(tmp_path):
    """Would catch the oracle computing, over bytes written after the run began, answers it
    files under the digest it began with."""
    path, memo = small_file(tmp_path), SignedDigests(tmp_path / "cache")
    fresh_load(path, memo)
    lazy = fresh_load(path, memo)
    tamper(path, path.stat().st_size - 64, b"\x00" * 64)
    private_copy._LAST_READ.clear()
    with pytest.raises(WeightsError, match="changed since the run began"):
        lazy.tensors["wte.weight"]


def test_a_file_written_in_place_is_read_again_whatever_the_memo_held(tmp_path):
    """Would catch a memo keyed on size and mtime alone: the write moves the ctime."""
    path, memo = small_file(tmp_path), SignedDigests(tmp_path / "cache")
    before = fresh_load(path, memo)
    tamper(path, path.stat().st_size - 64, b"\x01" * 64)
    after = fresh_load(path, memo)
    assert after.tensors.read and after.sha256 != before.sha256


@pytest.mark.parametrize("forgery", ["another secret", "no mac"])
def test_a_memo_not_signed_with_the_secret_is_not_believed(tmp_path, forgery):
    """Would catch a memo read without its MAC: a forged entry would put the digest of the
    weights as they were on a file rewritten since, and a run whose answers are all cached
    would then judge against answers for weights the student's process never read."""
    path, cache = small_file(tmp_path), tmp_path / "cache"
    honest = fresh_load(path, SignedDigests(cache))
    tamper(path, path.stat().st_size - 64, b"\x02" * 64)
    key = private_copy.stat_key(path)
    if forgery == "another secret":
        elsewhere = SignedDigests(tmp_path / "elsewhere")
        elsewhere.learn(key, {"sha256": honest.sha256, "parts": {}})
        (cache / MEMO_FILE).write_bytes((tmp_path / "elsewhere" / MEMO_FILE).read_bytes())
    else:
        import json

        forged = {json.dumps(list(key)): {"sha256": honest.sha256, "parts": {}}}
        (cache / MEMO_FILE).write_text(json.dumps(forged))
    loaded = fresh_load(path, SignedDigests(cache))
    assert loaded.tensors.read and loaded.sha256 != honest.sha256


def test_a_run_whose_student_could_read_the_secret_keeps_no_memo(tmp_path, monkeypatch):
    """Would catch a memo given to a run whose student's process runs as the grader's own
    user: it could sign a digest for weights it rewrote, or a slower machine's rate (which
    would loosen every floor)."""
    from theinference.grading.digests import SignedRates
    from theinference.grading.session import rate_memo

    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path))
    own = types.SimpleNamespace(traits=types.SimpleNamespace(own_user=True))
    other = types.SimpleNamespace(traits=types.SimpleNamespace(own_user=False))
    assert digest_memo(own) is None and rate_memo(own) is None
    assert isinstance(digest_memo(other), SignedDigests)
    assert isinstance(rate_memo(other), SignedRates)


def test_a_class_runs_warm_up_reads_through_the_memo_its_submissions_read(tmp_path, monkeypatch):
    """Would catch `theinference grade` reading and hashing the whole checkpoint before every
    class run (its warm-up blind to the memo each submission's run reads), or given a memo
    where the class's student processes could read its secret."""
    from theinference.classroom.class_run import warm_weights

    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path / "cache"))
    path = small_file(tmp_path)
    other = types.SimpleNamespace(traits=types.SimpleNamespace(own_user=False))
    own = types.SimpleNamespace(traits=types.SimpleNamespace(own_user=True))
    private_copy._LAST_READ.clear()
    assert warm_weights(str(path), tmp_path, print, other).tensors.read  # read: learned now
    private_copy._LAST_READ.clear()
    assert not warm_weights(str(path), tmp_path, print, other).tensors.read  # known: not read
    private_copy._LAST_READ.clear()
    assert warm_weights(str(path), tmp_path, print, own).tensors.read  # no memo for its own user


def test_a_synthetic_file_the_memo_knows_is_not_read_up_front(tmp_path, monkeypatch, weights):
    """Would catch the default weights still read whole by every warm `theinference test`."""
    import shutil

    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path))
    shutil.copyfile(weights.path, tmp_path / weights.path.name)
    memo = SignedDigests(tmp_path)
    private_copy._LAST_READ.clear()
    assert weights_module.load_weights("synthetic", tmp_path, memo=memo).tensors.read
    private_copy._LAST_READ.clear()
    lazy = weights_module.load_weights("synthetic", tmp_path, memo=memo)
    assert not lazy.tensors.read and lazy.sha256 == weights.sha256
    assert np.array_equal(lazy.tensors["h.0.ln_1.bias"], weights.tensors["h.0.ln_1.bias"])
    assert len(lazy.tensors._tensors) > 1  # read whole: each tensor's digest is learned now
    private_copy._LAST_READ.clear()
    alone = weights_module.load_weights("synthetic", tmp_path, memo=memo)
    assert np.array_equal(alone.tensors["h.0.ln_1.bias"], weights.tensors["h.0.ln_1.bias"])
    assert list(alone.tensors._tensors) == ["h.0.ln_1.bias"]  # that tensor alone was read


def test_a_tensor_read_alone_is_checked_against_its_own_digest(tmp_path):
    """Would catch a tensor read alone on a memo's word without its bytes hashed: a tensor
    rewritten after the run began would reach the oracle."""
    path, memo = small_file(tmp_path), SignedDigests(tmp_path / "cache")
    whole = fresh_load(path, memo)
    fresh_load(path, memo).tensors["wpe.weight"]  # a known file read whole: its parts learned
    lazy = fresh_load(path, memo)
    assert np.array_equal(lazy.tensors["h.1.attn.c_attn.weight"],
                          whole.tensors["h.1.attn.c_attn.weight"])
    assert list(lazy.tensors._tensors) == ["h.1.attn.c_attn.weight"]
    from theinference.oracle.safetensors_io import read_header

    header, start = read_header(path)
    tamper(path, start + header["h.0.mlp.c_fc.bias"]["data_offsets"][0], b"\x03" * 8)
    private_copy._LAST_READ.clear()
    with pytest.raises(WeightsError, match="changed since the run began"):
        lazy.tensors["h.0.mlp.c_fc.bias"]


def test_embedding_rows_read_alone_are_the_tensors_rows_each_checked_against_its_digest(tmp_path):
    """Would catch the token embedding read whole (154 MB read and hashed) for a swap's few
    hundred random rows, rows gathered in the wrong order or shape (repeated, negative, none),
    and a row read alone on the memo's word without its bytes hashed."""
    from theinference.oracle import gpt2

    path, memo = small_file(tmp_path), SignedDigests(tmp_path / "cache")
    whole = fresh_load(path, memo)
    fresh_load(path, memo).tensors["wpe.weight"]  # a known file read whole: rows learned too
    lazy = fresh_load(path, memo)
    wte = np.asarray(whole.tensors["wte.weight"])
    for ids in ([5, 3, 5, 299, 0], [], [-1, 2], [[1, 2], [3, 4]], 7):
        assert np.array_equal(lazy.tensors.rows("wte.weight", ids), wte[ids]), ids
    given = np.array([-1, 2])
    lazy.tensors.rows("wte.weight", given)
    assert given.tolist() == [-1, 2], "the caller's token ids were changed"
    assert np.array_equal(gpt2.embed([9, 4, 9], lazy.tensors), gpt2.embed([9, 4, 9], whole.tensors))
    assert "wte.weight" not in lazy.tensors._tensors  # its rows alone were read
    from theinference.oracle.safetensors_io import read_header

    header, start = read_header(path)
    row_bytes = 4 * SMALL.n_embd
    tamper(path, start + header["wte.weight"]["data_offsets"][0] + 42 * row_bytes, b"\x04" * 8)
    private_copy._LAST_READ.clear()
    assert np.array_equal(lazy.tensors.rows("wte.weight", [41, 43]), wte[[41, 43]])
    with pytest.raises(WeightsError, match="changed since the run began"):
        lazy.tensors.rows("wte.weight", [41, 42])


def test_a_memo_learned_before_row_digests_reads_the_file_whole_once_more(tmp_path):
    """Would catch a memo kept from before the rows' digests were learned leaving every later
    run to read the whole embedding for good (its rows never learned)."""
    path, memo = small_file(tmp_path), SignedDigests(tmp_path / "cache")
    fresh_load(path, memo)
    fresh_load(path, memo).tensors["wpe.weight"]
    key = private_copy.stat_key(path)
    memo.learn(key, {**memo.known(key), "rows": {}})  # as an earlier release kept it
    again = fresh_load(path, memo)
    again.tensors["wpe.weight"]
    assert again.tensors.read and len(again.tensors._tensors) > 1  # read whole
    assert "wte.weight" in memo.known(key)["rows"]
