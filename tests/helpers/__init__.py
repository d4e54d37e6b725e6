def kernel_keeps_exit_status() -> bool:
    """Whether this kernel answers a reaped process's exit status through its pidfd
    (``PIDFD_GET_INFO`` with ``PIDFD_INFO_EXIT``, Linux 6.15+); older kernels cannot tell it."""
    import os
    import re

    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (6, 15)
