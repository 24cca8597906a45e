#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""--http-listen end to end, on loopback: 3 kvnodes (rf 2) and a kvrouter
with /metrics, /health and the dashboard, under kvbench load.

  ops_http_test.py BUILD_DIR metrics
      scrapes every process twice under load and parses the text with an
      independent parser (Debian's python3-prometheus-client): names follow
      the conventions, counters move, histograms are consistent (cumulative
      buckets, _count equal to the +Inf bucket); /health answers 200 with a
      JSON reason, and 503 for a node without a cluster map.
  ops_http_test.py BUILD_DIR dashboard
      headless Chromium loads the router's page while kvbench runs; the
      rendered DOM must hold a row per node and the key kvbench made hottest;
      the screenshot is kept as BUILD_DIR/tests/integration/dashboard.png.

Prints "N passed, N failed" at the end; exits non-zero on a failure.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

BUILD = os.path.abspath(sys.argv[1])
MODE = sys.argv[2]
KVCTL = os.path.join(BUILD, "client/kvctl")
passed = failed = 0
procs = []


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(args, log, env=None):
    p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                         env=dict(os.environ, **env) if env else None)
    p.log = log
    procs.append(p)
    return p


def http_get(url, timeout=5, token=None):
    """(status, body) of a GET (with the bearer token when given); status 0
    when nothing answered."""
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def wait_http(url, deadline_s=20):
    end = time.time() + deadline_s
    while time.time() < end:
        st, _ = http_get(url, 1)
        if st:
            return True
        time.sleep(0.1)
    return False


def kvctl(router, *args):
    return subprocess.run([KVCTL, "--router", router, "--timeout", "5000", *args],
                          capture_output=True, text=True, timeout=60)


def cleanup(tmp):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        # a clean exit: no sanitizer report (leak, overflow) at shutdown
        check(p.returncode == 0, f"{os.path.basename(p.args[0])} exited {p.returncode} "
                                 f"(see {p.log})")
    if failed and not os.environ.get("KV_KEEP_TEST_DATA"):
        print("logs:", tmp)
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".log"):
                print("----", f)
                print(open(os.path.join(tmp, f)).read()[-3000:])
    if not os.environ.get("KV_KEEP_TEST_DATA"):
        shutil.rmtree(tmp, ignore_errors=True)


def cluster(tmp, router_token=None):
    """Starts 3 nodes and a router, all with --http-listen (the router's
    with router_token as its HTTP token, through $KV_HTTP_TOKEN). Returns
    (router rpc url, router http url, [node http urls])."""
    nodes, specs = [], []
    for i in range(1, 4):
        rpc, http = free_port(), free_port()
        start([os.path.join(BUILD, "node/kvnode"), "--id", f"n{i}", "--listen",
               f"tcp://127.0.0.1:{rpc}", "--data-dir", f"{tmp}/n{i}", "--mem-mb", "64",
               "--slow-dir", f"{tmp}/n{i}-slow",  # HotRAP and NHC run: their metrics too
               "--fast-stop-pct", "150",
               "--http-listen", f"http://127.0.0.1:{http}"], f"{tmp}/n{i}.log")
        nodes.append(f"http://127.0.0.1:{http}")
        specs.append(f"n{i}=tcp://127.0.0.1:{rpc}")
    for n in nodes:
        if not wait_http(n + "/health"):
            raise SystemExit("a node's HTTP listener did not come up")
    r = subprocess.run([KVCTL, "cluster", "init", "--rf", "2", *specs], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit("cluster init: " + r.stdout + r.stderr)
    rrpc, rhttp = free_port(), free_port()
    start([os.path.join(BUILD, "shard/kvrouter"), "--listen", f"tcp://127.0.0.1:{rrpc}",
           "--seeds", ",".join(s.split("=", 1)[1] for s in specs), "--hot-window-ms", "500",
           "--http-listen", f"http://127.0.0.1:{rhttp}"], f"{tmp}/router.log",
          env={"KV_HTTP_TOKEN": router_token} if router_token else None)
    router = f"tcp://127.0.0.1:{rrpc}"
    end = time.time() + 20
    while time.time() < end and http_get(f"http://127.0.0.1:{rhttp}/health", 1)[0] != 200:
        time.sleep(0.2)
    return router, f"http://127.0.0.1:{rhttp}", nodes, specs


def kvbench(tmp, router, seconds, name):
    return start([os.path.join(BUILD, "bench/kvbench/kvbench"), "--router", router,
                  "--workload", "B", "--dist", "zipf", "--keys", "2000", "--load",
                  "--seconds", str(seconds), "--threads", "2", "--concurrency", "4",
                  "--report-top", "3"], f"{tmp}/{name}.log")


# ---- metrics ----

def scrape(url):
    from prometheus_client.parser import text_string_to_metric_families
    st, body = http_get(url + "/metrics")
    check(st == 200, f"{url}/metrics answers 200 (got {st})")
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    return fams, body


def value(fams, family, sample, **labels):
    f = fams.get(family)
    if not f:
        return None
    total = None
    for s in f.samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            total = (total or 0) + s.value
    return total


def check_families(fams, body, who):
    for name, f in fams.items():
        check(name.startswith("hotkv_"), f"{who}: {name} has the hotkv_ prefix")
        if f.type == "counter":
            check(all(s.name.endswith("_total") or s.name.endswith("_created")
                      for s in f.samples), f"{who}: counter {name} samples end in _total")
        if f.type == "histogram":
            series = {}
            for s in f.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, {"b": [], "count": None})
                if s.name.endswith("_bucket"):
                    series[key]["b"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    series[key]["count"] = s.value
            for key, d in series.items():
                les = [le for le, _ in d["b"]]
                vals = [v for _, v in d["b"]]
                check(les == sorted(les) and les[-1] == float("inf"),
                      f"{who}: {name}{key} buckets sorted, ending at +Inf")
                check(all(a <= b for a, b in zip(vals, vals[1:])),
                      f"{who}: {name}{key} buckets cumulative")
                check(d["count"] == vals[-1], f"{who}: {name}{key} _count == +Inf bucket")
    for unit in ("_ms", "_us", "_ns", "_kb", "_mb"):
        check(not any(n.endswith(unit) or (unit + "_") in n for n in fams),
              f"{who}: base units only (no {unit})")


def metrics_mode(tmp):
    router, rhttp, nodes, _ = cluster(tmp)
    st, body = http_get(rhttp + "/health")
    check(st == 200 and json.loads(body)["status"] == "serving",
          f"router /health 200 serving: {st} {body}")
    for n in nodes:
        st, body = http_get(n + "/health")
        check(st == 200 and json.loads(body)["status"] == "serving",
              f"node /health 200 serving: {st} {body}")
    # a node outside the cluster has no map: 503 with the reason
    lone_http = free_port()
    start([os.path.join(BUILD, "node/kvnode"), "--id", "lone", "--listen",
           f"tcp://127.0.0.1:{free_port()}", "--data-dir", f"{tmp}/lone",
           "--http-listen", f"http://127.0.0.1:{lone_http}"], f"{tmp}/lone.log")
    wait_http(f"http://127.0.0.1:{lone_http}/health")
    st, body = http_get(f"http://127.0.0.1:{lone_http}/health")
    check(st == 503 and json.loads(body)["status"] == "no_map" and "\n" == body[-1]
          and body.count("\n") == 1, f"node without a map: 503, one JSON line: {st} {body}")
    st, _ = http_get(rhttp + "/nope")
    check(st == 404, f"unknown path 404 (got {st})")

    bench = kvbench(tmp, router, 10, "bench")
    time.sleep(6)
    r1, body = scrape(rhttp)
    check_families(r1, body, "router")
    n1 = [scrape(n)[0] for n in nodes]
    for i, f in enumerate(n1):
        check_families(f, "", f"n{i + 1}")
    time.sleep(3)
    r2, _ = scrape(rhttp)
    n2 = [scrape(n)[0] for n in nodes]
    bench.wait(timeout=120)

    g1 = value(r1, "hotkv_router_requests", "hotkv_router_requests_total", method="kv.Get",
               code="OK")
    g2 = value(r2, "hotkv_router_requests", "hotkv_router_requests_total", method="kv.Get",
               code="OK")
    check(g1 and g2 and g2 > g1, f"router kv.Get OK requests move: {g1} -> {g2}")
    c2 = value(r2, "hotkv_router_request_duration_seconds",
               "hotkv_router_request_duration_seconds_count", method="kv.Get")
    check(c2 and c2 >= g2, f"router kv.Get latency histogram counts the calls: {c2} >= {g2}")
    k1 = value(r1, "hotkv_router_rpc_calls_received", "hotkv_router_rpc_calls_received_total")
    k2 = value(r2, "hotkv_router_rpc_calls_received", "hotkv_router_rpc_calls_received_total")
    check(k1 and k2 and k2 > k1 and k2 >= g2, f"router calls received move: {k1} -> {k2}")
    for fam in ("rpc_shed", "rpc_expired"):
        v = value(r2, f"hotkv_router_{fam}", f"hotkv_router_{fam}_total")
        check(v is not None, f"router {fam} counter exported: {v}")
    lim = value(r2, "hotkv_router_rpc_max_inflight_calls", "hotkv_router_rpc_max_inflight_calls")
    check(lim and lim > 0, f"router in-flight limit exported: {lim}")
    for i in range(1, 4):
        f1 = value(r1, "hotkv_router_forwards", "hotkv_router_forwards_total", node=f"n{i}")
        f2 = value(r2, "hotkv_router_forwards", "hotkv_router_forwards_total", node=f"n{i}")
        check(f1 and f2 and f2 > f1, f"forwards to n{i} move: {f1} -> {f2}")
        e2 = value(r2, "hotkv_router_forward_errors", "hotkv_router_forward_errors_total",
                   node=f"n{i}")
        check(e2 == 0, f"no forward errors to n{i}: {e2}")
        st = value(r2, "hotkv_router_node_state", "hotkv_router_node_state", node=f"n{i}",
                   state="up")
        check(st == 1, f"router sees n{i} up: {st}")
    for i, (a, b) in enumerate(zip(n1, n2)):
        who = f"n{i + 1}"
        for m in ("kv.Get", "kv.Put"):
            x = value(a, "hotkv_node_requests", "hotkv_node_requests_total", method=m, code="OK")
            y = value(b, "hotkv_node_requests", "hotkv_node_requests_total", method=m, code="OK")
            check(x is not None and y > x, f"{who}: {m} requests move: {x} -> {y}")
        x = value(a, "hotkv_node_rpc_calls_received", "hotkv_node_rpc_calls_received_total")
        y = value(b, "hotkv_node_rpc_calls_received", "hotkv_node_rpc_calls_received_total")
        check(x is not None and y > x, f"{who}: calls received move: {x} -> {y}")
        v = value(b, "hotkv_node_rpc_shed", "hotkv_node_rpc_shed_total")
        check(v is not None, f"{who}: shed counter exported: {v}")
        mem = value(b, "hotkv_node_reads", "hotkv_node_reads_total", tier="memory")
        check(mem and mem > 0, f"{who}: memory-tier hits counted: {mem}")
        for fam in ("hotkv_node_wal_written_bytes", "hotkv_node_write_amplification",
                    "hotkv_node_hotring_visited", "hotkv_node_hotring_head_hits",
                    "hotkv_node_hotrap_promoted_records", "hotkv_node_hotrap_retained_records",
                    "hotkv_node_nhc_state", "hotkv_node_compaction_written_bytes",
                    "hotkv_node_volume_write_bytes", "hotkv_node_hot_keys_pinned",
                    "hotkv_node_hot_keys_tracked", "hotkv_node_memory_bytes",
                    "hotkv_node_serving_state", "hotkv_node_flush_stalls",
                    "hotkv_node_fast_volume_sst_bytes", "hotkv_node_fast_volume_sst_peak_bytes",
                    "hotkv_node_l0_moves_past", "hotkv_node_sst_old_format_files",
                    "hotkv_node_sst_index_memory_bytes"):
            check(fam in b, f"{who}: {fam} exported")
        fb = value(b, "hotkv_node_fast_volume_sst_bytes", "hotkv_node_fast_volume_sst_bytes")
        fp = value(b, "hotkv_node_fast_volume_sst_peak_bytes",
                   "hotkv_node_fast_volume_sst_peak_bytes")
        check(fb is not None and fp is not None and fp >= fb,
              f"{who}: fast-volume SST bytes {fb} within their peak {fp}")
        w1 = value(a, "hotkv_node_wal_written_bytes", "hotkv_node_wal_written_bytes_total")
        w2 = value(b, "hotkv_node_wal_written_bytes", "hotkv_node_wal_written_bytes_total")
        check(w2 > w1, f"{who}: WAL bytes move: {w1} -> {w2}")
        v = value(b, "hotkv_node_volume_write_bytes", "hotkv_node_volume_write_bytes_total",
                  volume="fast")
        check(v and v > 0, f"{who}: fast-volume writes counted: {v}")
        s = value(b, "hotkv_node_serving_state", "hotkv_node_serving_state", state="serving")
        check(s == 1, f"{who}: serving state gauge: {s}")
    # every metric the Grafana dashboard charts exists in a real scrape
    import re
    bodies = http_get(rhttp + "/metrics")[1] + "".join(http_get(n + "/metrics")[1] for n in nodes)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    board = json.load(open(os.path.join(src, "deploy/grafana-dashboard.json")))
    names = {n for p in board["panels"] for t in p["targets"]
             for n in re.findall(r"hotkv_[a-z0-9_]+", t["expr"])}
    check(len(names) > 20, f"the dashboard charts {len(names)} metrics")
    names.discard("hotkv_node_hints_records")  # a series per target, only while hints are held
    for n in sorted(names):
        check(re.search(r"^" + n + r"[{ ]", bodies, re.M) is not None,
              f"grafana-dashboard.json's {n} is exported")
    out = kvctl(router, "--json", "status")
    check(out.returncode == 0 and '"live_keys":' in out.stdout, "kvctl status: live_keys")


# ---- dashboard ----

def chromium():
    for c in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(c)
        if p:
            return p
    return None


def dashboard_mode(tmp):
    browser = chromium()
    if not browser:
        print("FAIL: no chromium (deploy/deps.sh installs Debian's chromium package)")
        sys.exit(1)
    token = "dash/b0ard+t0ken"  # the page is opened as /?token=..., percent-encoded
    router, rhttp, nodes, specs = cluster(tmp, token)
    bench = kvbench(tmp, router, 30, "bench")
    time.sleep(9)  # loaded, then a few seconds of the timed run: samples and hot keys
    for path in ("/", "/metrics", "/api/cluster"):
        st, body = http_get(rhttp + path)
        check(st == 401 and "--http-token" in body, f"{path} without the token: 401 ({st})")
        st, _ = http_get(rhttp + path, token="wrong")
        check(st == 401, f"{path} with a wrong token: 401 ({st})")
    st, _ = http_get(rhttp + "/health")
    check(st == 200, f"/health needs no token ({st})")
    page = rhttp + "/?token=" + urllib.parse.quote(token, safe="")
    # on a loaded host the reports take a few windows to reach the nodes'
    # views: wait (bounded) for the first hot key before rendering the page
    end = time.time() + 30
    while True:
        st, api = http_get(rhttp + "/api/hotkeys", token=token)
        hot_api = json.loads(api)["keys"] if st == 200 else []
        if hot_api or time.time() > end:
            break
        time.sleep(0.5)
    check(st == 200, f"/api/hotkeys 200 ({st})")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--user-data-dir=" + os.path.join(tmp, "chrome")]
    # the page as a browser renders it; the hot keys come from the nodes'
    # views, refreshed every second: a dump may land between two (up to 3)
    for _ in range(3):
        dom = subprocess.run([browser, *flags, "--virtual-time-budget=6000", "--dump-dom",
                              page], capture_output=True, text=True, timeout=120).stdout
        first = hot_api[0]["key"] if hot_api else None
        if first and f'<code class="hot-key">{first}</code>' in dom:
            break
        st, api = http_get(rhttp + "/api/hotkeys", token=token)
        hot_api = json.loads(api)["keys"] if st == 200 else []
    shot = os.path.join(BUILD, "tests/integration/dashboard.png")
    subprocess.run([browser, *flags, "--virtual-time-budget=6000", "--window-size=1400,1900",
                    "--screenshot=" + shot, page], capture_output=True, timeout=120)
    open(os.path.join(BUILD, "tests/integration/dashboard.html.dump"), "w").write(dom)
    bench.wait(timeout=180)
    out = open(f"{tmp}/bench.log").read()
    top = None
    for line in out.splitlines():
        if '"top":[' in line:
            top = json.loads(line[line.index('"top":[') + 6:].split("]")[0] + "]")[0]["key"]
            break
    if top is None:
        try:
            rep = json.loads(out[out.index("{"):])
            top = rep["top"][0]["key"]
        except (ValueError, KeyError, IndexError):
            pass
    check(top is not None, "kvbench reported its hottest key")
    check('data-loaded="1"' in dom, "the page rendered its data (no fetch error)")
    for i in range(1, 4):
        check(f'class="node-row" data-node="n{i}"' in dom, f"a node row for n{i}")
    check(dom.count('class="hot-row"') >= 1, "hot-key rows rendered")
    check(top is not None and f'<code class="hot-key">{top}</code>' in dom,
          f"kvbench's hottest key {top} is shown (API had {[k['key'] for k in hot_api][:5]})")
    check("<polyline" in dom, "charts drawn")
    check(os.path.exists(shot) and os.path.getsize(shot) > 10000, f"screenshot kept: {shot}")

    # a membership change: its streams show up in /api/cluster and on the page
    rpc4 = free_port()
    start([os.path.join(BUILD, "node/kvnode"), "--id", "n4", "--listen", f"tcp://127.0.0.1:{rpc4}",
           "--data-dir", f"{tmp}/n4", "--mem-mb", "64"], f"{tmp}/n4.log")
    end = time.time() + 20
    while time.time() < end and kvctl(f"tcp://127.0.0.1:{rpc4}", "ping").returncode != 0:
        time.sleep(0.2)
    add = kvctl(router, "node", "add", f"n4=tcp://127.0.0.1:{rpc4}", "--no-wait")
    check(add.returncode == 0, f"kvctl node add --no-wait: {add.stdout} {add.stderr}")
    trans = None
    end = time.time() + 30
    while time.time() < end:
        st, body = http_get(rhttp + "/api/cluster", token=token)
        c = json.loads(body) if st == 200 else {}
        if c.get("transition") and c["transition"]["streams"] and \
                all(x["state"] != "unknown" for x in c["transition"]["streams"]):
            trans = c["transition"]
            break
        time.sleep(0.5)
    check(trans is not None and trans["kind"] == "add" and trans["nodes"][0] == "n4",
          f"/api/cluster shows the transition with its streams' progress: {trans}")
    check(trans is not None and all(x["target"] == "n4" for x in trans["streams"]),
          "every stream of an add targets the new node")
    dom = subprocess.run([browser, *flags, "--virtual-time-budget=6000", "--dump-dom", page],
                         capture_output=True, text=True, timeout=120).stdout
    check('class="stream-row"' in dom and "add n4" in dom, "the page shows the migration's streams")
    check('data-node="n4"' in dom, "and the new node's row")


def main():
    tmp = tempfile.mkdtemp(prefix="hotkv-http-")
    try:
        metrics_mode(tmp) if MODE == "metrics" else dashboard_mode(tmp)
    finally:
        cleanup(tmp)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


main()
