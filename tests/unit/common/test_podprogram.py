"""A worker program leaves with its main's exit code, its output flushed, and no interpreter finalization
(the daemon threads still inside C code are what finalization would pull the ground from under)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import atexit, logging, sys, threading, time
    from cdi.common import podprogram

    atexit.register(lambda: print("finalized", flush=True))
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()

    def main():
        logging.basicConfig(stream=sys.stderr)
        logging.getLogger("p").warning("logged")
        sys.stdout.write("result line")  # no newline, no flush: run() flushes it
        return {code}
    podprogram.run(main)
""")


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(code=code)], capture_output=True, text=True,
                          timeout=60, check=False)


def test_exit_code_output_and_no_finalization() -> None:
    for code in ("0", "1", "3"):
        result = run(code)
        assert result.returncode == int(code)
        assert result.stdout == "result line"  # flushed, and atexit's "finalized" never printed
        assert "logged" in result.stderr


def test_a_system_exit_from_main_is_its_code() -> None:
    result = run("sys.exit(2)")
    assert result.returncode == 2 and result.stdout == "result line"
