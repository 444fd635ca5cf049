"""What the benchmarks share: starting processes, the portal calls that set a run up, and the
figures read from outside the processes measured (wrk, /proc CPU time, the gateway's /metrics)."""

import json
import os
import re
import subprocess
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


def db_commands(gateway_url: str) -> dict[str, float]:
    """The gateway's MongoDB commands so far, by name (PyMongo command monitoring, via /metrics)."""
    try:
        text = urllib.request.urlopen(gateway_url + "/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^gateway_db_commands_total\{command="([^"]+)"\}\s+([0-9.e+]+)$', text, re.M)
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to report CPU per request: robust on a noisy machine."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port: int, requests: list[tuple[str, str]], seconds: float, connections: int) -> dict:
    """wrk with a Lua script that walks the same request list (path, api key) round-robin."""
    entries = ",".join('{"%s","%s"}' % (p, k) for p, k in requests)
    script = (
        "local reqs = {%s}\nlocal i = 0\nrequest = function()\n  i = i %% #reqs + 1\n"
        "  local r = reqs[i]\n  if r[2] ~= '' then wrk.headers['X-API-Key'] = r[2] end\n"
        "  return wrk.format('GET', r[1])\nend\n"
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format(\'JSON {"requests": %%d, "p50_ms": %%.3f, "p99_ms": %%.3f, "errors": %%d}\\n\',\n'
        "    summary.requests, latency:percentile(50)/1000, latency:percentile(99)/1000,\n"
        "    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.timeout))\nend\n"
    ) % entries
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{int(seconds)}s", "-s", fh.name, f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(fh.name)
    figures = json.loads(out.split("JSON ", 1)[1].splitlines()[0])
    figures["rps"] = round(figures["requests"] / seconds, 1)
    figures["tool"] = "wrk"
    return figures
