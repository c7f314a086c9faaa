"""The conformance check (`./inv check-scheduler NAME`): is a scheduler correct enough to compare?

    reference.py  the gradients every role can recompute, the tensor sets, the reference average
    role.py       the role process of a check job (`python -m conformance.role SPEC.json`)
    jobs.py       one job on loopback: servers and workers as processes, their answers
    checks.py     the checks (averages, a dead peer, what close() leaves), each one row
    demo.py       one run on the demo network through the normal run path: verdict, efficiency
    table.py      the rows as the table the command prints

The loopback tests (tests/loopback/test_conformance.py) run the same checks on every built-in.
"""
