"""The kernel and the emulated network one run uses.

- `network`: `Testbed`, Mininet up, roles launched in hosts, everything torn down.
- `topology`, `tc`, `netlink`: the Mininet `Topo`, htb shaping, rtnetlink in the hosts' namespaces.
- `machine`, `cgroups`, `capabilities`, `preflight`: kernel settings, CPU cgroups, what this kernel can emulate.
- `monitor`, `fidelity`, `probe`: link, queue and CPU monitors, the verdict from them, iperf3 between hosts.
- `shaping`, `crosstraffic`: the threads that apply rate schedules and run iperf3 flows.
- `cleanup`: what a run started, recorded so that anything can be torn down later.
- `freshos`: the README's commands in a freshly installed Debian 12.
"""
