"""`radixcache whatif` on hostile input: special files, absurd options, ids and lengths that
break the block rule, odd bytes; every case one line and the right exit code, no traceback,
no hang."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from cli.main import main
from radixcache.traffic import traces


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["whatif", *args])
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run(args, capsys)
    assert (code, out, err.count("\n")) == (1, "", 1), err
    return err


def unboxed(err: str) -> str:
    """A usage error's words without the box rich draws around them."""
    return " ".join(err.replace("│", " ").split())


def write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_special_files_are_refused_before_they_are_opened(tmp_path, capsys):
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)  # no writer: opening it would block for ever
    assert error_line([str(fifo)], capsys) == f"error: {fifo}: not a regular file\n"
    assert error_line(["/dev/zero"], capsys) == "error: /dev/zero: not a regular file\n"
    assert error_line([str(tmp_path)], capsys) == f"error: {tmp_path}: not a regular file\n"


def test_a_file_over_the_size_limit_is_refused(tmp_path, capsys, monkeypatch):
    path = write(tmp_path / "m.jsonl", [{"input_length": 1, "hash_ids": [1]}] * 3)
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 40)
    size = path.stat().st_size
    assert error_line([str(path)], capsys) == (
        f"error: {path}: {size:,} bytes exceeds the 40-byte limit\n")


@pytest.mark.parametrize("args", [
    ["--pool-blocks", "9223372036854775807"],
    ["--hash-block-size", "9223372036854775807"],
    ["--at", "99999999999999999999999"],
    ["--at", "-5"],
    ["--kv-bytes-per-token", "9223372036854775807"],
    ["--sample", "0"],
    ["--sample", "1.5"],
    ["--replicas", "2"],  # without --pool-blocks
    ["--plot", "x.gif"],
    ["--model", "gpt-9"],
])
def test_absurd_options_are_usage_errors_before_any_work(args, tmp_path, capsys):
    # the source does not exist: exit 2 (not 1) shows the options were checked first
    code, out, err = run([str(tmp_path / "missing.jsonl"), *args], capsys)
    assert (code, out) == (2, "") and "Traceback" not in err


def test_sampling_a_token_source_is_a_usage_error(tmp_path, capsys):
    path = write(tmp_path / "t.jsonl", [{"prompt": [1, 2, 3]}])
    code, _, err = run([str(path), "--sample", "0.1"], capsys)
    assert code == 2 and "sampling needs a Mooncake-format trace" in unboxed(err)


def test_no_matplotlib_is_a_usage_error_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    code, out, err = run([str(tmp_path / "missing.jsonl"), "--plot", "c.png"], capsys)
    assert (code, out) == (2, "") and "pip install 'radixcache[plot]'" in unboxed(err)


def test_the_block_rule_on_hash_ids(tmp_path, capsys):
    path = write(tmp_path / "m.jsonl", [{"input_length": 1, "hash_ids": list(range(1000))}])
    assert error_line([str(path)], capsys) == (
        f"error: {path}:1: 1000 hash ids for 1 tokens: blocks of 512 tokens need exactly 1: "
        "is --hash-block-size right?\n")
    path = write(tmp_path / "m.jsonl", [{"input_length": 0, "hash_ids": []}])
    assert "a token count of 0 (want >= 1)" in error_line([str(path)], capsys)
    for bad in (2**64, -1):
        path = write(tmp_path / "m.jsonl", [{"input_length": 5, "hash_ids": [bad]}])
        assert error_line([str(path)], capsys) == (
            f"error: {path}:1: hash id {bad} is outside [0, 2^64)\n")
    # ids of 64 bits (a hash) are ids like any other
    path = write(tmp_path / "m.jsonl", [{"input_length": 600, "hash_ids": [2**63 + 5, 2**64 - 1]},
                                        {"input_length": 600, "hash_ids": [2**63 + 5, 2**64 - 1]}])
    code, out, _ = run([str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["max_hit_rate"] == 600 / 1200


def test_odd_bytes_are_named(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_text('{"input_length": 5, "hash_ids": [1], "note": "\\ud800"}\n')
    assert error_line([str(path)], capsys) == (
        f"error: {path}:1: not a Mooncake-format request: a string holds a lone UTF-16 "
        "surrogate escape (\\ud800-\\udfff)\n")
    path.write_bytes(b'\xef\xbb\xbf{"input_length": 5, "hash_ids": [1]}\n')  # a BOM: fine
    code, out, _ = run([str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["requests"] == 1
    path.write_bytes(b'\xef\xbb\xbf{"prompt": [1, 2, 3]}\n')
    code, out, _ = run([str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["format"] == "tokens"


def test_a_damaged_recordings_note_is_given_once(tmp_path, capsys):
    out = tmp_path / "chat.rcx"
    with pytest.raises(SystemExit):
        main(["record", "--workload", "chat", "--requests", "6", "--blocks", "512",
              "--out", str(out)])
    data = out.read_bytes()
    out.write_bytes(data[: len(data) * 2 // 3])
    capsys.readouterr()
    # three passes over the file (block 16, block 1, an LRU replay at 2 sizes) and one note
    code, _, err = run([str(out), "--alignment", "--policies", "lru", "--samples", "2",
                        "--json"], capsys)
    assert code == 0 and err.count("note: ") == 1 and "read up to byte" in err
    # on one line, the whole of it (Rich wrapped it at 80 columns off a terminal)
    assert re.fullmatch(rf"note: {re.escape(str(out))}: read up to byte \d+: truncated frame: "
                        r"\d+ bytes announced, \d+ present\n", err), err


def test_a_recordings_own_pool_is_the_pool(tmp_path, capsys):
    out = tmp_path / "chat.rcx"
    with pytest.raises(SystemExit):
        main(["record", "--workload", "chat", "--requests", "6", "--blocks", "512",
              "--out", str(out)])
    capsys.readouterr()
    code, text, _ = run([str(out), "--json"], capsys)
    pool = json.loads(text)["pool"]
    assert code == 0 and (pool["blocks"], pool["tokens"], pool["given_by"]) == (
        512, 512 * 16, "recording")
    code, text, _ = run([str(out), "--json", "--block-size", "4"], capsys)
    assert json.loads(text)["pool"]["blocks"] == 512 * 4  # the same tokens in blocks of 4
