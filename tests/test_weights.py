"""The checkpoint loader: synthetic bytes are stable, bad files are refused with a reason,
foreign layouts are made canonical, and the real-GPT-2 path works without the network."""

import hashlib
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from theinference.oracle import synthetic, weights
from theinference.oracle import weights as weights_module
from theinference.oracle.config import ModelConfig, expected_shapes
from theinference.oracle.safetensors_io import write_file

STREAM_CRC = 3841106273  # crc32 of standard_normalish("wte", 100_000)
SMALL = ModelConfig(n_layer=2, n_embd=128, vocab_size=300, n_ctx=32)


def small_tensors(prefix: str = "") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        prefix + name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in expected_shapes(SMALL).items()
    }


def save(tmp_path: Path, tensors: dict, name: str = "m.safetensors") -> Path:
    from safetensors.numpy import save_file

    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def test_synthetic_checkpoint_bytes_match_the_recorded_sha256(weights):
    digest = hashlib.sha256(weights.path.read_bytes()).hexdigest()
    assert digest == synthetic.SYNTHETIC_SHA256
    assert weights.label == f"synthetic ({synthetic.SYNTHETIC_SHA256[:12]})"


def test_synthetic_stream_is_fixed_integer_arithmetic():
    # a stream's bytes are pinned (so a change to the generator cannot slip by), it has the
    # moments of a standard normal, and a prefix of a stream is the shorter stream
    z = synthetic.standard_normalish("wte", 100_000)
    assert zlib.crc32(z.tobytes()) == STREAM_CRC
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    np.testing.assert_array_equal(z[:3], synthetic.standard_normalish("wte", 3))


def test_synthetic_checkpoint_has_gpt2_124m_names_and_shapes(weights):
    from safetensors.numpy import load_file

    loaded = load_file(str(weights.path))  # the reference library reads our writer's output
    assert {k: v.shape for k, v in loaded.items()} == expected_shapes(weights.config)
    assert weights.config == ModelConfig(n_layer=12, n_embd=768, vocab_size=50257, n_ctx=1024)
    assert all(v.dtype == np.float32 for v in loaded.values())
    np.testing.assert_array_equal(loaded["h.3.mlp.c_fc.bias"], weights.tensors["h.3.mlp.c_fc.bias"])


def test_synthetic_weights_are_memory_mapped_read_only(weights):
    wte = weights.tensors["wte.weight"]
    assert not wte.flags.writeable
    with pytest.raises(ValueError):
        wte[0, 0] = 1.0


def test_synthetic_generation_is_atomic_and_made_once_and_told(tmp_path, monkeypatch):
    """Catches the checkpoint made twice, a temporary file left behind, and the wait while it
    is made going untold (a first run silent for seconds) or told again when nothing is made."""
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path))
    calls, told = [], []
    real = synthetic.synthetic_tensors
    monkeypatch.setattr(synthetic, "synthetic_tensors", lambda: calls.append(1) or real())
    first = weights.load_weights("synthetic", tmp_path, told.append).path
    second = weights.load_weights("synthetic", tmp_path, told.append).path
    assert first == second and len(calls) == 1
    assert len(told) == 1 and "making the synthetic GPT-2 weights" in told[0], told
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_canonical_user_file_is_used_in_place(tmp_path):
    path = save(tmp_path, small_tensors())
    w = weights.load_weights(str(path), tmp_path)
    assert w.path == path.resolve() and w.config == SMALL
    assert w.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_prefix_buffers_and_half_precision_are_made_canonical(tmp_path, monkeypatch):
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path / "cache"))
    tensors = {k: v.astype(np.float16) for k, v in small_tensors("transformer.").items()}
    tensors["transformer.h.0.attn.bias"] = np.ones((1, 1, 32, 32), np.float16)
    tensors["transformer.h.1.attn.masked_bias"] = np.ones((1,), np.float16)
    path = save(tmp_path, tensors)
    w = weights.load_weights(str(path), tmp_path)
    assert w.path != path and w.path.parent == tmp_path / "cache"
    assert set(w.tensors) == set(expected_shapes(SMALL))
    assert w.tensors["wte.weight"].dtype == np.float32


def bad_files():
    good = small_tensors()
    missing = dict(good)
    del missing["h.1.mlp.c_fc.bias"]
    extra = {**good, "h.0.attn.surprise": np.zeros(3, np.float32)}
    wrong = {**good, "h.0.attn.c_attn.weight": np.zeros((128, 128), np.float32)}
    return {
        "missing": (missing, "missing tensor(s) h.1.mlp.c_fc.bias"),
        "extra": (extra, "unexpected tensor(s) h.0.attn.surprise"),
        "wrong shape": (wrong, "has shape [128, 128], expected [128, 384]"),
        "no embeddings": ({"h.0.ln_1.weight": good["h.0.ln_1.weight"]}, "missing tensor 'wte"),
    }


@pytest.mark.parametrize("case", list(bad_files()))
def test_bad_checkpoints_are_refused_with_the_reason(case, tmp_path):
    tensors, expected = bad_files()[case]
    path = save(tmp_path, tensors)
    with pytest.raises(weights.WeightsError) as info:
        weights.load_weights(str(path), tmp_path)
    assert expected in str(info.value)


def test_truncated_and_non_safetensors_files_are_refused(tmp_path):
    path = save(tmp_path, small_tensors())
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(weights.WeightsError, match="past the end of the file"):
        weights.load_weights("cut.safetensors", tmp_path)
    (tmp_path / "junk.safetensors").write_bytes(b"PK\x03\x04 this is a zip, not a checkpoint")
    with pytest.raises(weights.WeightsError, match="not a safetensors file"):
        weights.load_weights("junk.safetensors", tmp_path)
    (tmp_path / "tiny.safetensors").write_bytes(b"abc")
    with pytest.raises(weights.WeightsError, match="too short"):
        weights.load_weights("tiny.safetensors", tmp_path)
    with pytest.raises(weights.WeightsError, match="does not exist"):
        weights.load_weights("nowhere.safetensors", tmp_path)


def test_gpt2_comes_from_the_hub_at_the_pinned_revision(tmp_path, monkeypatch):
    import huggingface_hub

    path = save(tmp_path, small_tensors())
    asked = {}

    def fake_download(repo_id, filename, revision=None, **kwargs):
        asked.update(repo_id=repo_id, filename=filename, revision=revision)
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    w = weights.load_weights("gpt2", tmp_path)
    assert asked == {
        "repo_id": "openai-community/gpt2",
        "filename": "model.safetensors",
        "revision": weights.HF_REVISION,
    }
    assert w.name == "gpt2" and w.config == SMALL


def test_unreachable_hub_names_the_alternatives(monkeypatch, tmp_path):
    """Catches a grader that, with no network and no cached file, asks the Hub anyway (the
    client's retries took 24 s) or answers in the client's words instead of its own."""
    import huggingface_hub

    from theinference.oracle import hub

    asked = []

    def offline(*args, **kwargs):
        asked.append(kwargs)
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline and not in the cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    monkeypatch.setattr(hub, "reachable", lambda host, port: False)
    with pytest.raises(weights.WeightsError) as info:
        weights.load_weights("gpt2", tmp_path)
    text = str(info.value)
    assert "not in the local Hugging Face cache" in text and "cannot be reached" in text
    assert "--weights synthetic" in text and "--weights path/to/model.safetensors" in text
    assert asked == [{"revision": weights.HF_REVISION, "local_files_only": True}]


def test_a_cached_file_is_used_without_the_network(monkeypatch, tmp_path):
    """Catches a lookup that probes or contacts the Hub although the file is cached."""
    import huggingface_hub

    from theinference.oracle import hub

    path = save(tmp_path, small_tensors())

    def cached_only(repo_id, filename, revision=None, local_files_only=False):
        assert local_files_only, "the Hub was asked before the local cache"
        return str(path)

    def no_probe(host, port):
        raise AssertionError("the network was probed for a cached file")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_only)
    monkeypatch.setattr(hub, "reachable", no_probe)
    assert weights.load_weights("gpt2", tmp_path).config == SMALL


def test_hf_hub_offline_is_honoured_without_a_probe(monkeypatch, tmp_path):
    """Catches HF_HUB_OFFLINE=1 ignored (a probe or a download attempted)."""
    import huggingface_hub

    from theinference.oracle import hub

    def not_cached(*args, local_files_only=False, **kwargs):
        assert local_files_only
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", not_cached)
    monkeypatch.setattr(hub, "reachable", lambda host, port: pytest.fail("probed"))
    with pytest.raises(weights.WeightsError, match="HF_HUB_OFFLINE is set"):
        weights.load_weights("gpt2", tmp_path)


def test_no_hub_log_line_reaches_stderr(monkeypatch, tmp_path, capfd):
    """Catches the hub client's retry log ("Retrying in 1s [Retry 1/5]") reaching the user
    when the Hub's host answers but the download fails."""
    import logging

    import huggingface_hub
    from huggingface_hub.utils import logging as hub_logging

    from theinference.oracle import hub

    hub_logging.get_logger("huggingface_hub.utils._http")  # the client's own stderr handler

    def failing(*args, local_files_only=False, **kwargs):
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        for attempt in range(1, 6):
            logging.getLogger("huggingface_hub.utils._http").warning(
                f"Retrying in 1s [Retry {attempt}/5]."
            )
        raise OSError("the connection was reset")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    monkeypatch.setattr(hub, "reachable", lambda host, port: True)
    with pytest.raises(weights.WeightsError, match="the connection was reset"):
        weights.load_weights("gpt2", tmp_path)
    assert "Retry" not in capfd.readouterr().err
    assert logging.getLogger("huggingface_hub").level != logging.CRITICAL  # put back after


def test_with_no_network_the_command_says_so_in_its_own_words(tmp_path, template_course):
    """The real hub client, end to end: a Hub endpoint that refuses connections and an empty
    Hugging Face cache. Catches the five-retry log and a message that is not the grader's."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections are refused
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    env.pop("HF_HUB_OFFLINE", None)
    command = [sys.executable, "-m", "theinference", "test", "-C", str(template_course)]
    done = subprocess.run(
        [*command, "--weights", "gpt2"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 4, done.stderr
    assert "Retry" not in done.stderr and "thrown while requesting" not in done.stderr
    assert "cannot be reached" in done.stderr and "--weights synthetic" in done.stderr


def test_our_writer_is_byte_stable(tmp_path):
    t = small_tensors()
    write_file(tmp_path / "a.safetensors", t)
    write_file(tmp_path / "b.safetensors", dict(reversed(list(t.items()))))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def tamper(path: Path, offset: int, data: bytes) -> None:
    """What a hostile submission running as the file's owner can do: write in place, then put
    the times back."""
    st = path.stat()
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_tampered_synthetic_file_moves_nothing_and_is_made_again(tmp_path, monkeypatch, weights):
    """Would catch the oracle reading the file the student's process can write (weights
    memory-mapped and shared), or a check fooled by times put back (a size/mtime memo)."""
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path))
    path = tmp_path / weights.path.name
    shutil.copyfile(weights.path, path)
    loaded = weights_module.load_weights("synthetic", tmp_path)
    ln_f = np.array(loaded.tensors["ln_f.weight"])
    tamper(path, path.stat().st_size - 4096, b"\x00" * 4096)  # inside wte.weight, the last
    tamper(path, 4096, b"\x00" * 64)
    assert np.array_equal(loaded.tensors["ln_f.weight"], ln_f)  # the grader's own copy
    assert np.asarray(loaded.tensors["wte.weight"])[-1].any()
    again = weights_module.load_weights("synthetic", tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == synthetic.SYNTHETIC_SHA256
    assert again.notes and "altered" in again.notes[0]


def test_the_in_process_hash_memo_sees_a_write_with_times_put_back(tmp_path):
    """Would catch a memo keyed on size and mtime only: the second read must see new bytes."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    first = weights_module.read_private(path).sha256
    tamper(path, 10, b"b")
    read = weights_module.read_private(path)
    assert first != read.sha256 and bytes(read.buffer[10:11]) == b"b"
    assert not list(tmp_path.glob("*.json"))  # no memo on disk for anyone to forge


def test_a_tampered_canonical_copy_is_made_again(tmp_path, monkeypatch):
    """Would catch the student's canonical copy of a user's file going unchecked after it was
    made: tampered, it would give the student other weights than the oracle's."""
    monkeypatch.setenv("THEINFERENCE_CACHE_DIR", str(tmp_path / "cache"))
    source = save(tmp_path, small_tensors(prefix="transformer."))
    first = weights_module.load_weights(str(source), tmp_path)
    assert first.path.parent == tmp_path / "cache" and not first.notes
    tamper(first.path, first.path.stat().st_size - 64, b"\x00" * 64)
    second = weights_module.load_weights(str(source), tmp_path)
    assert second.notes and "altered" in second.notes[0]
    from theinference.oracle.safetensors_io import map_tensors

    mapped = map_tensors(second.path)
    assert all(np.array_equal(mapped[k], second.tensors[k]) for k in second.tensors)
