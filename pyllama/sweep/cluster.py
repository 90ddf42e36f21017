"""Where the cells run: Dask distributed, an existing engine; nothing here schedules work itself.

* no address: a ``LocalCluster`` of worker processes on loopback, sized to the machine
  (workers × threads per cell ≤ cores), each worker running one cell at a time;
* ``--scheduler tcp://HOST:8786`` or ``DASK_SCHEDULER_ADDRESS``: that cluster's workers, which need
  pyllama installed and the study's model, tokenizer, probe and plugin files at the same paths.

A worker's BLAS/OpenMP pools are pinned to the cell's thread count (environment for a LocalCluster's
processes, and ``threadpoolctl`` inside each cell for any cluster). The cells are submitted with
``retries``: a cell whose worker dies is run again elsewhere by the scheduler.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from pyllama.errors import InputError

__all__ = ["CONNECT_TIMEOUT", "cluster_client", "local_size"]

CONNECT_TIMEOUT = 5  # seconds: an unreachable scheduler is reported quickly, before any work
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
LOOPBACK_ANY_PORT = "127.0.0.1:0"
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def machine_cores() -> int:
    from pyllama.model import default_threads

    return default_threads()


def local_size(workers: int | None, threads_per_cell: int | None) -> tuple[int, int]:
    """``(workers, threads per cell)`` of a LocalCluster: by default as many one-thread workers as
    cores; given one of the two, the other fills the machine; both given are taken as they are."""
    cores = machine_cores()
    if threads_per_cell is None:
        threads_per_cell = max(1, cores // workers) if workers else 1
    if workers is None:
        workers = max(1, cores // threads_per_cell)
    if workers < 1 or threads_per_cell < 1:
        raise InputError(f"workers ({workers}) and threads per cell ({threads_per_cell}) must be at least 1")
    return workers, threads_per_cell


def scheduler_address(scheduler: str | None) -> str | None:
    return scheduler or os.environ.get(SCHEDULER_ENV) or None


@contextmanager
def cluster_client(
    scheduler: str | None = None,
    workers: int | None = None,
    threads_per_cell: int | None = None,
    timeout: float = CONNECT_TIMEOUT,
):
    """A connected ``distributed.Client`` (and the threads per cell), closed (with its LocalCluster) on exit."""
    from distributed import Client, LocalCluster

    address = scheduler_address(scheduler)
    if address:
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise InputError(f"scheduler {address}: cannot connect within {timeout:g} s ({_reason(exc)})") from None
        try:
            yield client, threads_per_cell or 1
        finally:
            client.close()
        return
    n_workers, threads = local_size(workers, threads_per_cell)
    env = dict.fromkeys(THREAD_ENV, str(threads))
    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,  # one cell at a time per worker process; the cell's kernels use `threads`
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": LOOPBACK_ANY_PORT},  # its health routes: never a fixed port
        silence_logs=logging.ERROR,
        env=env,
    )
    client = Client(cluster, set_as_default=False)
    try:
        yield client, threads
    finally:
        client.close()
        cluster.close()


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] if text else type(exc).__name__
