"""Chaos drills: cluster launcher, faults, workloads, history, checker, report."""
