"""The copy task's reward, slowed down so that a tiny run's steps take long enough to be interrupted
mid-run by the fault-injection tests (registered as a reward by file path)."""

import time

from training.rewards import char_accuracy

SECONDS_PER_CALL = 0.15


def slow_char_accuracy(data_source, solution_str, ground_truth, extra_info):
    time.sleep(SECONDS_PER_CALL)
    return char_accuracy(data_source, solution_str, ground_truth, extra_info)
