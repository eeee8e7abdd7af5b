"""``python -m bucketq.bench.moto_server``: moto's own server, minus a directory scan per request.

moto server picks the service of every request by testing whether the host name is one of its
backends, and it lists them by reading its package directory: ``os.listdir`` and an
``os.path.isdir`` for each of about 175 entries, twice a request (moto 5.2). That scan is a
quarter of the CPU moto spends on a bucketq request (measured: 3.4 ms a request, 2.6 ms
without it), and it is the same answer every time: the directory is moto's installed package,
which does not change while the server runs. So this entry point reads it once and then runs
``moto.server`` unchanged: same S3 emulation, same arguments, same access log.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    import moto.backends
    import moto.server

    scan = getattr(moto.backends, "list_of_moto_modules", None)
    if scan is not None:  # moto releases without it (the `local` extra allows 5.x) run as they are
        modules = tuple(scan())

        def list_of_moto_modules() -> Iterable[str]:
            return modules

        moto.backends.list_of_moto_modules = list_of_moto_modules
    moto.server.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
