#!/usr/bin/env python3
"""After a failed ctest run: the failed tests' gtest failures, short, as the last thing printed.

CI keeps only the tail of the log, where ctest's own summary names the failed tests but not why; this
prints, for each test in Testing/Temporary/LastTestsFailed.log, the lines that follow each gtest
": Failure" in its output (from LastTest.log), each cut to a few hundred characters.

usage: ctest_digest.py BUILD_DIR
"""
import pathlib
import re
import sys

LINES_PER_FAILURE = 8
CHARS_PER_LINE = 240
FAILURES_PER_TEST = 4


def test_outputs(log: str) -> dict:
    """Test name -> its output, from ctest's LastTest.log."""
    out = {}
    for block in re.split(r"^(?=\d+/\d+ Testing: )", log, flags=re.M):
        m = re.match(r"\d+/\d+ Testing: (.*)", block)  # the whole name: parametrised ones hold spaces
        if m:
            out[m.group(1).rstrip()] = block
    return out


def digest(name: str, block: str) -> list:
    block = block.split("<end of output>")[0]
    lines = block.split("\nOutput:\n", 1)[-1].splitlines()
    shown, failures = [], 0
    for i, line in enumerate(lines):
        if not line.endswith(": Failure") or failures == FAILURES_PER_TEST:
            continue
        failures += 1
        for l in lines[i : i + LINES_PER_FAILURE]:
            shown.append("  " + (l if len(l) <= CHARS_PER_LINE else l[:CHARS_PER_LINE] + " ..."))
    if not block:
        return [f"{name}: its output is not in LastTest.log"]
    if not shown:  # no gtest failure (a crash, a timeout): its output's last lines
        shown = ["  " + l[:CHARS_PER_LINE] for l in lines[-LINES_PER_FAILURE:]]
    return [f"{name}: {failures} gtest failure(s) shown"] + shown


def main() -> int:
    tmp = pathlib.Path(sys.argv[1]) / "Testing" / "Temporary"
    failed_log, last_log = tmp / "LastTestsFailed.log", tmp / "LastTest.log"
    if not failed_log.exists() or not last_log.exists():
        print(f"ctest_digest: no {failed_log} or {last_log}")
        return 0
    names = [l.split(":", 1)[1] for l in failed_log.read_text().splitlines() if ":" in l]
    outputs = test_outputs(last_log.read_text(errors="replace"))
    print("\n==== why the failed tests failed (ctest_digest.py; full output above) ====")
    for name in names:
        print("\n".join(digest(name, outputs.get(name, ""))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
