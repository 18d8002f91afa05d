"""The planner: per-rank memory, traffic, schedule order and bubble of a run, predicted from shapes.

    python -m launcher plan --mesh 2x2x2 --model small [--schedule 1f1b] [--hardware h100-sxm-8x] [--json]
    python -m launcher plan --search --world-size 8 --model small

Pure functions of a preflighted TrainRun (train.preflight.preflight): nothing is allocated, no
process group exists. shapes.py holds what comes from the model's shapes (meta device, fake
tensors), schedule.py what comes from torch's own schedule order, traffic.py the accounting's
closed forms, predict.py the Plan that joins them; hardware.py the hardware models (one contract,
the named targets' table, ``local`` measured by calibrate.py), steptime.py the step time by part,
search.py the ranking of every mesh and schedule, command.py the CLI's flags. measure.py is the
other side (one rank of the real trainer on torch's fake process group) that the tests compare the
predictions against; on ``local`` its stage_overhead (each pp stage's CPU against its FLOPs, a few
seconds of forked ranks) also feeds the step time, the one measured input of a plan.
"""
