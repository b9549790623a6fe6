"""``oomScoreAdj`` / ``--oom-score-adj``: make the kernel's OOM killer spare the proxy.

Upstream kube-proxy writes the value (default -999, ``qos.KubeProxyOOMScoreAdj``) to
``/proc/self/oom_score_adj`` when ``Run`` starts, through ``pkg/util/oom``: two tries
100 ms apart, a missing file is not retried, and a failure does not stop the proxy.
:func:`apply_oom_score_adj` does the same; the path is a parameter so tests write to a
file of their own. Upstream logs the failure at V(2); kubeproxy logs it as a warning, so
an unprivileged container that cannot lower its score says so at the default verbosity.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

OOM_SCORE_ADJ_PATH = "/proc/self/oom_score_adj"
_TRIES = 2
_RETRY_DELAY = 0.1


def apply_oom_score_adj(value: int, path: str = OOM_SCORE_ADJ_PATH) -> bool:
    """Write ``value`` to ``path``; True if it took. A failure is logged, not raised."""
    error: OSError | None = None
    for attempt in range(_TRIES):
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(str(value))
        except FileNotFoundError as err:
            error = err
            break
        except OSError as err:
            error = err
            if attempt + 1 < _TRIES:
                time.sleep(_RETRY_DELAY)
            continue
        log.debug("Set %s to %d", path, value)
        return True
    log.warning("Failed to apply OOMScore: cannot write %d to %s: %s", value, path, error)
    return False
