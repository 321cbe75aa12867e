"""`voicepipe simulate`: mini-O4's own planner and pool at a scale this machine cannot run, in virtual time.

The engine core comes from `scheduler.sim` (the real `Engine` on a priced runner and a virtual clock);
this package adds what the scheduler must not know: the traffic (text requests by a process or a trace,
voice calls with their ASR and TTS jobs and their pacing), the models and devices by name, the figures
the benches print, the CPU's fitted cost model and its validation, and the seed article's experiment.
docs/simulator.md says how to read and trust the results.
"""
