"""The agent's in-flight byte budget: a reservation fits up to the limit exactly, and what is released is free again."""

from __future__ import annotations

import threading

from agent.serving.budget import ByteBudget


def test_reservations_fit_up_to_the_limit_and_not_one_byte_more() -> None:
    budget = ByteBudget(100)
    assert budget.try_reserve(60) and budget.try_reserve(40) and budget.used == 100
    assert not budget.try_reserve(1) and budget.used == 100  # a refusal takes nothing
    budget.release(40)
    assert budget.used == 60 and not budget.try_reserve(41) and budget.try_reserve(40)
    assert ByteBudget(0).try_reserve(0) and not ByteBudget(0).try_reserve(1)


def test_threads_never_reserve_past_the_limit() -> None:
    budget = ByteBudget(1000)
    taken: list[bool] = []

    def reserve() -> None:
        for _ in range(200):
            taken.append(budget.try_reserve(7))

    threads = [threading.Thread(target=reserve) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == 1000 // 7 and budget.used == 7 * (1000 // 7)
