"""The planner: per-rank memory, traffic, schedule order and bubble of a run, predicted from shapes.

    python -m launcher plan --mesh 2x2x2 --model small [--schedule 1f1b] [--json]

Pure functions of a preflighted TrainRun (train.preflight.preflight): nothing is allocated, no
process group exists. shapes.py holds what comes from the model's shapes (meta device), schedule.py
what comes from torch's own schedule order, traffic.py the accounting's closed forms, predict.py the
Plan that joins them, measure.py the other side (one rank of the real trainer on torch's fake
process group) that the tests and bench compare the predictions against.
"""
