"""What the benchmarks share: starting processes, the portal calls that set a run up, and the
figures read from outside the processes measured (wrk, /proc CPU time, the gateway's /metrics)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

UPSTREAM_KEY = "bench-upstream-key"
HERE = os.path.dirname(os.path.abspath(__file__))


def http(method: str, url: str, body: dict | None = None, token: str | None = None) -> dict:
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def spawn(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        args, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def metric_totals(gateway_url: str, series: str, label: str) -> dict[str, float]:
    """One series of the gateway's /metrics by the value of `label`, summed over its other labels (the
    workers among them); {} when /metrics cannot be read."""
    try:
        text = urllib.request.urlopen(gateway_url + "/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    totals: dict[str, float] = {}
    for m in re.finditer(rf"^{series}\{{([^}}]*)\}}\s+(\S+)$", text, re.M):
        if found := re.search(rf'\b{label}="([^"]*)"', m.group(1)):
            totals[found.group(1)] = totals.get(found.group(1), 0.0) + float(m.group(2))
    return totals


def db_commands(gateway_url: str) -> dict[str, float]:
    """The gateway's MongoDB commands so far, by name (PyMongo command monitoring, via /metrics)."""
    return metric_totals(gateway_url, "gateway_db_commands_total", "command")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to report CPU per request: robust on a noisy machine."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Process ids whose parent is `pid` (Linux /proc): the workers of `serve --workers N`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return found


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def ensure_packages(wanted: dict[str, bool]) -> None:
    """apt-get install the packages of `wanted` ({package: already there}) that are missing, when we may (root):
    the install first, and only when it fails (a stale or empty package index) an update and a second try."""
    missing = [package for package, present in wanted.items() if not present]
    if not missing or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    print(f"bench: installing {' '.join(missing)} with apt-get...", file=sys.stderr, flush=True)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", *missing]
    if subprocess.run(install, env=env, check=False, **quiet).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, **quiet)
        subprocess.run(install, env=env, check=False, **quiet)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def start_nginx(work: str, name: str, conf: str) -> subprocess.Popen:
    """nginx in the foreground with its own configuration, pid and logs under `work` (no system paths)."""
    os.makedirs(os.path.join(work, "nginx-tmp"), exist_ok=True)
    path = os.path.join(work, f"{name}.conf")
    with open(path, "w") as fh:
        fh.write(conf)
    return spawn([nginx_binary(), "-p", work, "-c", path])


# wrk's Lua: the request list walked round-robin; with `statuses`, every answer counted by status, and the 2xx
# answers and all answers by wall-clock second (each thread its own counts; done() sums them). wrk hands each
# answer to Lua then, which costs it a little CPU: both sides of a comparison pay it alike.
WRK_SCRIPT = """local reqs = {%s}
local i = 0
local threads = {}
statuses, ok_at, all_at = {}, {}, {}
setup = function(thread) table.insert(threads, thread) end
request = function()
  i = i %% #reqs + 1
  local r = reqs[i]
  if r[2] ~= '' then wrk.headers['X-API-Key'] = r[2] end
  -- Live reads: these benchmarks measure the provider-bound job, never the answer cache (bench/cache.py does).
  wrk.headers['Cache-Control'] = 'no-cache'
  return wrk.format('GET', r[1])
end
%s
local function sum(name)
  local sums, out = {}, {}
  for _, thread in ipairs(threads) do
    for k, n in pairs(thread:get(name) or {}) do sums[k] = (sums[k] or 0) + n end
  end
  for k, n in pairs(sums) do out[#out + 1] = string.format('"%%d": %%d', k, n) end
  return table.concat(out, ', ')
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('JSON {"requests": %%d, "p50_ms": %%.3f, "p99_ms": %%.3f, "errors": %%d, '
    .. '"non_2xx": %%d, "socket_errors": {"connect": %%d, "read": %%d, "write": %%d, "timeout": %%d}, '
    .. '"statuses": {%%s}, "ok_at": {%%s}, "all_at": {%%s}}\\n',
    summary.requests, latency:percentile(50)/1000, latency:percentile(99)/1000,
    e.status + e.connect + e.read + e.write + e.timeout, e.status, e.connect, e.read, e.write, e.timeout,
    sum('statuses'), sum('ok_at'), sum('all_at')))
end
"""
COUNT_STATUSES = """response = function(status, headers, body)
  local now = os.time()
  statuses[status] = (statuses[status] or 0) + 1
  all_at[now] = (all_at[now] or 0) + 1
  if status >= 200 and status < 300 then ok_at[now] = (ok_at[now] or 0) + 1 end
end"""


def wrk(
    port: int,
    requests: list[tuple[str, str]],
    seconds: float,
    connections: int,
    timeout: float | None = None,
    statuses: bool = False,
) -> dict:
    """wrk with a Lua script that walks the same request list (path, api key) round-robin; its `done()` hook prints
    the figures as JSON: requests, p50/p99, errors (non-2xx and socket errors), and with `statuses` the count of
    each status (non-2xx counts only 4xx/5xx, as wrk does) and the answers by second ({unix second: count}, 2xx
    in ok_at, all in all_at)."""
    entries = ",".join('{"%s","%s"}' % (p, k) for p, k in requests)
    script = WRK_SCRIPT % (entries, COUNT_STATUSES if statuses else "")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
    command = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", fh.name]
    if timeout:
        command += [f"--timeout={max(1, round(timeout))}s"]
    out = subprocess.run([*command, f"http://127.0.0.1:{port}"], capture_output=True, text=True, check=True).stdout
    os.unlink(fh.name)
    figures = json.loads(out.split("JSON ", 1)[1].splitlines()[0])
    if not statuses:
        for name in ("statuses", "ok_at", "all_at"):
            del figures[name]
    figures["rps"] = round(figures["requests"] / seconds, 1)
    figures["tool"] = "wrk"
    return figures
