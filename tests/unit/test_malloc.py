"""The proxy caps glibc's malloc arenas (kubeproxy.malloc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_arena_cap_takes_on_glibc() -> None:
    # In a child: mallopt changes the whole process's allocator.
    code = textwrap.dedent(
        """
        from kubeproxy.malloc import limit_malloc_arenas
        print(limit_malloc_arenas())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True"
