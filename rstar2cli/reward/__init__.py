"""Math reward: answer normalisation, equivalence checks and the bounded batch grader.

See grader.py (batch API, worker processes), normalize.py (fast exact path) and grade_file.py
(`rstar2 eval --grade-only`).
"""

from rstar2cli.reward.answer_normalize import fast_equivalent, normalize_answer
from rstar2cli.reward.grader import (
    GRADE_STATUSES,
    TRUNCATED_FINISH_REASONS,
    Grader,
    GradeResult,
    is_equivalent,
    reference_answer,
)

__all__ = [
    "GRADE_STATUSES",
    "TRUNCATED_FINISH_REASONS",
    "GradeResult",
    "Grader",
    "fast_equivalent",
    "is_equivalent",
    "normalize_answer",
    "reference_answer",
]
