"""sandboxd: a fast, isolated Python tool-execution daemon (zygote + fork per job) and its client.

Modules: protocol (wire models), isolation (namespaces, rlimits, seccomp, uids), zygote (fork
server, per-slot zygote and its light runner, routing between them), job (one job: fork, pump,
kill, reap, wipe), runner (the snippet runner in the job child), pool (asyncio slots +
LocalSandbox), server (HTTP), auth (the shared token and when a daemon may go without it), client
(async, least-in-flight, retries). Imports neither torch nor rstar2cli.
"""
