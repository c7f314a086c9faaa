"""`roles.servers: best`: one parameter server on the host where it has the highest rate on the
configured network (emu/config/placement.py), resolved while the config is parsed."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import yaml

from analysis.bounds import ps_bound_s
from emu.config.capacity import capacity_graph
from emu.config.experiment import ConfigError
from emu.config.placement import best_server, server_rates
from emu.config.plan import load_plan, set_dotted
from emu.config.topospec import GraphTopology, LinkSpec, NetSpec, RacksTopology
from emu.run.results import flatten
from emu.sweeps.sweep import unique_runs
from tasks import _sections
from tests.conftest import REPO, invoke
from tests.factories import experiment, star_spec, star_topology, variant, write


def racks(n: int, per_rack: int, oversubscription: float) -> NetSpec:
    return RacksTopology.model_validate({"kind": "racks", "racks": n, "hosts_per_rack": per_rack,
                                         "host_bw_mbps": 10, "oversubscription": oversubscription}).resolve()


# ---------------------------------------------------------------------------- the choice, by hand

def test_star_host_with_a_fat_link_wins():
    """ps at 100 Mb/s: 4 workers on its link (25 Mb/s each way) but each worker's own 10 Mb/s
    link carries one gradient each way, so 10 Mb/s. A worker's host: its 10 Mb/s over the 3
    others, 3.33 Mb/s."""
    net = star_spec(100, 10, 10, 10, 10, names=["ps", "w0", "w1", "w2", "w3"])
    workers = ["w0", "w1", "w2", "w3"]
    rates = server_rates(net, workers)
    assert rates["ps"] == pytest.approx(10e6)
    assert rates["w0"] == pytest.approx(10e6 / 3)
    assert best_server(net, workers) == "ps"


def test_the_fat_host_wins_when_it_is_a_worker_too():
    """h0 at 100 Mb/s and a worker: the 3 others over its link (33 Mb/s), each at 10: 10 Mb/s."""
    net = star_spec(100, 10, 10, 10)
    assert best_server(net, net.hosts) == "h0"
    assert server_rates(net, net.hosts)["h0"] == pytest.approx(10e6)


def test_both_directions_count():
    """h0 uploads at 100 but downloads at 1: every worker's push crosses h0's slow direction."""
    net = star_spec((100, 1), 10, 10, (5, 5))
    workers = ["h1", "h2"]
    rates = server_rates(net, workers)
    assert rates["h0"] == pytest.approx(0.5e6)  # 1 Mb/s down for 2 pushes
    assert rates["h3"] == pytest.approx(2.5e6)  # 5 Mb/s each way for 2 workers
    assert rates["h1"] == pytest.approx(10e6)   # its 10 Mb/s for h2 alone
    assert best_server(net, workers) == "h1"


def test_racks_the_rack_with_more_workers_wins():
    """2 racks of 3 at 10 Mb/s, oversubscription 6: uplinks of 3 x 10 / 6 = 5 Mb/s. Workers:
    2 in rack 0 (r0h0, r0h1), 3 in rack 1.
    - r1h0 (a worker in rack 1): its link carries the 4 others, 10/4 = 2.5; each uplink the 2
      workers of rack 0, 5/2 = 2.5; rate 2.5 Mb/s (r1h1, r1h2 the same: the first wins).
    - r0h0 (a worker in rack 0): each uplink carries rack 1's 3 workers, 5/3 = 1.67.
    - r0h2 (not a worker, rack 0): its link carries all 5, 10/5 = 2, the uplinks 5/3: 1.67."""
    net = racks(2, 3, 6)
    workers = ["r0h0", "r0h1", "r1h0", "r1h1", "r1h2"]
    rates = server_rates(net, workers)
    assert rates == pytest.approx({"r0h0": 5e6 / 3, "r0h1": 5e6 / 3, "r0h2": 5e6 / 3,
                                   "r1h0": 2.5e6, "r1h1": 2.5e6, "r1h2": 2.5e6})
    assert best_server(net, workers) == "r1h0"


def test_racks_without_oversubscription_a_free_host_of_the_bigger_rack_is_not_better():
    """Oversubscription 1.5: uplinks 20 Mb/s. r0h2 (free): its link carries all 5 workers, 2 Mb/s;
    r1h0 (worker): its link 4, 2.5, uplinks 20/2 = 10; r0h0 (worker): 2.5 and 20/3: also 2.5,
    first in NetSpec order: r0h0."""
    net = racks(2, 3, 1.5)
    workers = ["r0h0", "r0h1", "r1h0", "r1h1", "r1h2"]
    assert server_rates(net, workers)["r0h2"] == pytest.approx(2e6)
    assert best_server(net, workers) == "r0h0"


def test_ties_go_to_the_first_host_in_netspec_order():
    assert best_server(star_spec(10, 10, 10, 10), ["h1", "h2", "h3"]) == "h1"
    assert best_server(star_spec(10, 10, 10, 10), ["h0", "h1", "h2", "h3"]) == "h0"
    # NetSpec order, not name order: zb is listed first
    assert best_server(star_spec(10, 10, names=["zb", "aa"]), ["zb", "aa"]) == "zb"
    # no worker needs a link: every host is as good (inf), the first wins
    net = star_spec(10, 10, 10)
    assert server_rates(net, ["h1"])["h1"] == float("inf")
    assert best_server(net, ["h1"]) == "h1"


def test_a_network_that_is_not_a_tree_is_refused():
    loop = NetSpec(hosts=["a", "b"], switches=["s1", "s2"], links=[
        LinkSpec("a", "s1", 10, 10), LinkSpec("b", "s2", 10, 10), LinkSpec("s1", "s2", 10, 10),
        LinkSpec("a", "s2", 10, 10)])
    with pytest.raises(ValueError, match="placement needs a tree"):
        server_rates(loop, ["a", "b"])


# ---------------------------------------------------------------------------- the same rate as the bound

def random_tree(rng: random.Random) -> NetSpec:
    """A `graph` topology: a random tree of 1-5 switches, 2-9 hosts on random switches,
    different rates per direction."""
    switches = [f"s{i}" for i in range(rng.randint(1, 5))]
    hosts = [f"h{i}" for i in range(rng.randint(2, 9))]
    nodes = [{"name": n, "kind": "switch"} for n in switches] + [{"name": n, "kind": "host"} for n in hosts]
    rng.shuffle(nodes)  # NetSpec order is not name order

    def rate():
        return rng.choice([1, 2, 5, 10, 10, 40, 100])
    links = [{"a": s, "b": rng.choice(switches[:i]), "ab_mbps": rate(), "ba_mbps": rate()}
             for i, s in enumerate(switches) if i]
    links += [{"a": h, "b": rng.choice(switches), "ab_mbps": rate(), "ba_mbps": rate()} for h in hosts]
    return GraphTopology.model_validate({"kind": "graph", "nodes": nodes, "links": links}).resolve()


@pytest.mark.parametrize("seed", range(40))
def test_rate_agrees_with_the_ps_bound_for_one_server(seed):
    """analysis/bounds.py ps_bound_s(S=1) is G x 8 / rate(s), every host s; the chosen host is
    the first whose bound is the lowest."""
    rng = random.Random(seed)
    net = random_tree(rng)
    workers = rng.sample(net.hosts, rng.randint(1, len(net.hosts)))
    g = capacity_graph(net)
    grad_bytes = 4e6
    rates = server_rates(net, workers)
    bounds = {s: ps_bound_s(g, workers, [s], grad_bytes) for s in net.hosts}
    for s in net.hosts:
        if bounds[s] == 0:
            assert rates[s] == float("inf")
        else:
            assert rates[s] == pytest.approx(grad_bytes * 8 / bounds[s], rel=1e-12)
    fastest = min(bounds.values())
    chosen = best_server(net, workers)
    assert bounds[chosen] == pytest.approx(fastest, rel=1e-12)
    assert chosen == next(s for s in net.hosts if bounds[s] <= fastest * (1 + 1e-12))


def test_large_network_is_fast():
    """16 racks of 64 hosts (the most racks allows): one walk, not a path per worker and host."""
    import time
    net = racks(16, 64, 4)
    t0 = time.perf_counter()
    best_server(net, net.hosts[5:])
    assert time.perf_counter() - t0 < 0.5


# ---------------------------------------------------------------------------- through the config

BEST = experiment(topology=star_topology(w0=10, ps=100, w1=10, w2=10),
                  roles={"servers": "best", "workers": ["w0", "w1", "w2"]})  # the server placed by `best`


def one(tmp_path, cfg):
    return load_plan(write(tmp_path, cfg), _sections()).experiments[0]


def test_best_resolves_to_a_host_in_the_config_row_and_run_id(tmp_path):
    exp = one(tmp_path, BEST)
    assert exp.roles.servers == ["ps"]
    resolved = exp.resolved()
    assert resolved["roles"] == {"servers": ["ps"], "workers": ["w0", "w1", "w2"]}
    assert yaml.safe_load(yaml.safe_dump(resolved))["roles"]["servers"] == ["ps"]  # config.yaml of the run
    assert json.loads(flatten(resolved)["roles.servers"]) == ["ps"]  # the row's column
    # the same experiment as naming the host: the same run
    assert exp.run_id(0) == one(tmp_path, variant("roles.servers", ["ps"], BEST)).run_id(0)


def test_a_different_network_moves_the_server_and_the_run_id(tmp_path):
    a = one(tmp_path, BEST)
    cfg = variant("topology.hosts.1.bw_mbps", 10, BEST)  # ps slows down to 10: w1 becomes the fat host
    set_dotted(cfg, "topology.hosts.2.bw_mbps", 100)
    b = one(tmp_path, cfg)
    assert (a.roles.servers, b.roles.servers) == (["ps"], ["w1"])
    assert a.run_id(0) != b.run_id(0)


def test_best_with_workers_rest(tmp_path):
    """"rest" with "best": the workers are every host but the server, and the server's host is
    chosen as if every host were a worker (the same rates: a worker on its host costs no link)."""
    exp = one(tmp_path, variant("roles.workers", "rest", BEST))
    assert exp.roles.servers == ["ps"] and exp.roles.workers == ["w0", "w1", "w2"]
    net = racks(2, 3, 6)
    for s in net.hosts:
        others = [h for h in net.hosts if h != s]
        assert server_rates(net, net.hosts)[s] == server_rates(net, others)[s]
    cfg = {**BEST, "topology": {"kind": "racks", "racks": 2, "hosts_per_rack": 3, "host_bw_mbps": 10,
                                "oversubscription": 6}, "roles": {"servers": "best", "workers": "rest"}}
    exp = one(tmp_path, cfg)
    assert exp.roles.servers == ["r0h0"]
    assert exp.roles.workers == ["r0h1", "r0h2", "r1h0", "r1h1", "r1h2"]


def test_a_grid_over_placements_runs_equal_ones_once(tmp_path, capsys):
    """A sweep compares the deployed placement with a given one; where they agree, one run."""
    plan = load_plan(write(tmp_path, variant("grid", {"roles.servers": ["best", ["ps"], ["w0"]]}, BEST)), _sections())
    assert [e.roles.servers for e in plan.experiments] == [["ps"], ["ps"], ["w0"]]
    assert plan.points[0] == {"roles.servers": "best"}  # the row's point.roles.servers says how it was chosen
    kept = unique_runs([(e, 0, p) for e, p in zip(plan.experiments, plan.points, strict=True)])
    assert [e.roles.servers for e, _, _ in kept] == [["ps"], ["w0"]]


BAD = [
    (variant("roles.servers", "worst", BEST), 'roles.servers: must be a list of host names or "best", got \'worst\''),
    (variant("roles.servers", {"best": 2}, BEST),
     "roles.servers: must be a list of host names or \"best\", got {'best': 2}"),
    (variant("roles.servers", ["best"], BEST), "roles.servers[0]: 'best' is not a host of the topology"),
    (variant("roles.servers", [1], BEST), "roles.servers[0]: must be a host name, got 1"),
    (variant("roles.workers", "all", BEST), 'roles.workers: must be a list of host names or "rest", got \'all\''),
    (variant("roles.workers", ["w0", "w9"], BEST), "roles.workers[1]: 'w9' is not a host of the topology"),
    (variant("scheduler", "ring", BEST),
     "roles.servers: scheduler 'ring' runs among the workers; it uses no servers (remove them)"),
    ({**BEST, "topology": {"kind": "racks", "racks": 1, "hosts_per_rack": 1, "host_bw_mbps": 10},
      "roles": {"servers": "best", "workers": "rest"}}, "roles.workers: no host is left for workers"),
]


@pytest.mark.parametrize("cfg,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_roles_name_the_field(tmp_path, cfg, message):
    with pytest.raises(ConfigError) as e:
        load_plan(write(tmp_path, cfg), _sections())
    assert str(e.value) == message


@pytest.mark.slow
def test_cli_bad_best_one_line_exit_2_nothing_created(tmp_path):
    results = tmp_path / "results"
    r = invoke("run", str(write(tmp_path, variant("scheduler", "ring", BEST))), "--results", str(results), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: roles.servers: scheduler 'ring' runs among the workers; it uses no servers " \
                               "(remove them)"
    assert not results.exists()


@pytest.mark.slow
def test_parsing_best_does_not_need_mininet(tmp_path):
    """Placement reads the capacity graph; parsing a config still imports no Mininet."""
    code = ("import sys; from emu.config.plan import load_plan; from tasks import _sections; "
            f"e = load_plan({str(write(tmp_path, BEST))!r}, _sections()).experiments[0]; "
            "assert e.roles.servers == ['ps']; assert 'mininet' not in sys.modules, 'mininet imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
