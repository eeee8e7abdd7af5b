"""Deterministic simulation of bucketq: virtual time, seeded faults, a recorded history and its checker.

One schedule (a seed) runs producers, consumer-group members, garbage collection and operator
actions as simulated processes inside one asyncio loop whose clock is virtual, over the engine's
own in-memory store wrapped in a seeded fault layer. Everything they do is recorded as a JSON
history, and :func:`tests.sim.checker.check` (a pure function of that history) decides whether the
protocol's guarantees held. The same seed always gives the same history.

Modules, one job each:

* ``clock``    virtual time: the event loop, the patched ``time`` functions, seeded entropy;
* ``process``  simulated processes: identity, clock skew, pauses, crashes (task ownership);
* ``faults``   the fault-injecting store wrapper, attributing each call to its process;
* ``history``  the recorded events (JSON lines);
* ``schedule`` scenario generation from a seed (named scenario families);
* ``actors``   producers, consumer members, the GC timer and the operator;
* ``checker``  the invariants, a pure function over a history;
* ``runner``   one schedule end to end, and batches of seeds;
* ``__main__`` the command line (``python -m tests.sim``).
"""
