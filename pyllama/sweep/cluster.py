"""Where the cells run: Dask distributed, an existing engine; nothing here schedules work itself.

* no address: a ``LocalCluster`` of worker processes on loopback, sized to the machine
  (workers × threads per cell ≤ cores), each worker running one cell at a time;
* ``--scheduler tcp://HOST:8786`` or ``DASK_SCHEDULER_ADDRESS``: that cluster's workers, which need
  pyllama installed and the study's model, tokenizer, probe and plugin files at the same paths.

Sizes and addresses are checked before any work: threads per cell within the engine's limit
(``pyllama.options.max_threads``: on this machine for a LocalCluster, on the smallest worker of a
cluster), a LocalCluster's workers × threads within it too, and an address distributed can connect
to as written (a malformed one would fail inside ``Client`` with a traceback).

Ctrl-C stops a local cluster's sweep in its own process alone (``dask_setup``): the workers ignore
it and are stopped with the cluster, so no worker prints a traceback.

A worker's BLAS/OpenMP pools are pinned to the cell's thread count (environment for a LocalCluster's
processes, and ``threadpoolctl`` inside each cell for any cluster). The cells are submitted with
``retries``: a cell whose worker dies is run again elsewhere by the scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from pyllama.errors import InputError
from pyllama.model import default_threads
from pyllama.options import THREADS_PER_CPU, check_threads, max_threads, usable_cpus
from pyllama.sweep.study import plural

__all__ = ["CONNECT_TIMEOUT", "check_address", "check_cluster_threads", "cluster_client", "drain", "local_size"]

CONNECT_TIMEOUT = 5  # seconds: an unreachable scheduler is reported quickly, before any work
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
LOOPBACK_ANY_PORT = "127.0.0.1:0"
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
HOST_PORT_SCHEMES = ("tcp", "tls", "ws", "wss")  # what a sweep's client can reach on another machine
THREADS_NAME = "threads per cell"  # how messages name threads_per_cell / --threads-per-cell


def machine_cores() -> int:
    return default_threads()


def local_size(workers: int | None, threads_per_cell: int | None) -> tuple[int, int]:
    """``(workers, threads per cell)`` of a LocalCluster: by default as many one-thread workers as
    cores; given one of the two, the other fills the machine; both given are taken as they are, up to
    the engine's limit of threads (``THREADS_PER_CPU`` × the usable CPUs) for the cell and for all
    workers together. InputError stating the range otherwise."""
    if threads_per_cell is not None:
        check_threads(threads_per_cell, name=THREADS_NAME, allow_default=False)
    cores = machine_cores()
    if threads_per_cell is None:
        threads_per_cell = max(1, cores // workers) if workers else 1
    if workers is None:
        workers = max(1, cores // threads_per_cell)
    if workers < 1 or threads_per_cell < 1:
        raise InputError(f"workers ({workers}) and threads per cell ({threads_per_cell}) must be at least 1")
    top = max_threads()
    if workers * threads_per_cell > top:
        raise InputError(
            f"{plural(workers, 'worker')} x {plural(threads_per_cell, 'thread')} per cell = "
            f"{workers * threads_per_cell} threads is out of range: valid is at most {top} "
            f"({THREADS_PER_CPU} x the {usable_cpus()} usable CPUs); lower the workers or the threads per cell"
        )
    return workers, threads_per_cell


def check_cluster_threads(client, threads_per_cell: int) -> None:
    """Refuse ``threads_per_cell`` above the engine's limit on the smallest worker of ``client``'s
    cluster (each worker reports its own, which may be above this machine's); no check of the upper
    limit when the workers cannot be asked."""
    if isinstance(threads_per_cell, bool) or not isinstance(threads_per_cell, int) or threads_per_cell < 1:
        raise InputError(f"{THREADS_NAME} {threads_per_cell!r} is out of range: valid is x >= 1")
    try:
        limits = client.run(max_threads)
    except Exception:  # no answer: each cell still checks its own threads
        return
    limits = {w: n for w, n in limits.items() if isinstance(n, int)}
    if limits and threads_per_cell > min(limits.values()):
        top = min(limits.values())
        raise InputError(
            f"{THREADS_NAME} {threads_per_cell} is out of range on the cluster: valid is 1 <= x <= {top} "
            f"({THREADS_PER_CPU} x the usable CPUs of its smallest worker)"
        )


def check_address(address: str, origin: str = "--scheduler") -> str:
    """``address`` if it is one a Client can connect to as written (``tcp://HOST:PORT``, or tls, ws,
    wss); InputError naming ``origin`` (the option or variable it came from) otherwise. Checked before
    a Client exists: a Client that fails on its address leaves a half-made object whose finaliser
    waits 10 s and prints a traceback."""
    from distributed.comm.addressing import parse_address, parse_host_port  # lazy, as below: Dask when a sweep runs

    expected = "expected tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786"
    try:
        scheme, loc = parse_address(address)
        if scheme not in HOST_PORT_SCHEMES:
            raise ValueError(scheme)
        host, port = parse_host_port(loc)
        if not host or not 0 < int(port) < 65536:
            raise ValueError(loc)
    except (ValueError, TypeError):
        raise InputError(f"{origin} {address!r}: not a Dask scheduler address ({expected})") from None
    if scheme == "tls":
        from distributed.security import Security

        if Security().get_connection_args("client").get("ssl_context") is None:
            raise InputError(
                f"{origin} {address!r}: a tls:// scheduler needs the client's TLS certificates in the Dask "
                "config (distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and .key)"
            )
    return address


def scheduler_address(scheduler: str | None) -> str | None:
    return scheduler or os.environ.get(SCHEDULER_ENV) or None


def address_origin(scheduler: str | None) -> str:
    """What to call the address in a message: the option, or the variable it came from."""
    return "--scheduler" if scheduler else SCHEDULER_ENV


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
        check_address(address, address_origin(scheduler))
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
        silence_logs=logging.CRITICAL,  # a worker logs a heartbeat that meets the closing scheduler as an ERROR with
        # a traceback (seen at the end of a leaderboard): not a failure; failures reach the rows (drain)
        env=env,
        preload=[__name__],  # dask_setup below, in each worker process
    )
    client = Client(cluster, set_as_default=False)
    try:
        yield client, threads
    finally:
        client.close()
        cluster.close()


def drain(
    client,
    items: Sequence[Any],
    submit: Callable[[Any], Any],
    done: Callable[[Any, Any, BaseException | None], None],
    unit: str,
    desc: str,
    progress: bool | None,
) -> None:
    """Run ``submit(item)``'s future for every item on ``client`` and hand each item to ``done(item,
    result, None)`` as it completes, or ``done(item, None, exc)`` when its task failed for good (e.g.
    KilledWorker: the row says so), under a progress bar ``desc`` counting ``unit``s. Futures are released as they are
    used, and an interrupted run cancels the rest, so it leaves no work behind on a cluster."""
    from distributed import as_completed  # lazy: Dask only when cells run
    from tqdm import tqdm  # the plain bar: tqdm.auto warns on stderr in a notebook without ipywidgets

    by_key, futures = {}, []
    for item in items:
        fut = submit(item)
        by_key[fut.key] = item
        futures.append(fut)
    bar = tqdm(total=len(futures), unit=unit, desc=desc, disable=None if progress is None else not progress)
    try:
        for fut in as_completed(futures, loop=client.loop):
            item = by_key[fut.key]
            try:
                result = fut.result()
            except Exception as exc:
                done(item, None, exc)
            else:
                done(item, result, None)
            bar.update(1)
            fut.release()
    finally:
        bar.close()
        client.cancel([f for f in futures if not f.done()])


def dask_setup(worker) -> None:
    """Run by each worker process of a local cluster as it starts (Dask's preload hook): Ctrl-C in
    a terminal signals the whole process group, and a worker that took it would print its own
    KeyboardInterrupt traceback. The sweep's own process takes it instead, cancels the cells and
    closes the cluster, which stops the workers."""
    if threading.current_thread() is threading.main_thread():  # only the main thread may set a handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] if text else type(exc).__name__
