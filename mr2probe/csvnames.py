"""ASCII column names of every CSV mr2probe writes (table.csv, summary.csv, metrics.csv, per_class.csv, the
compare files): the tables' labels (ΔHard, Sig↑, HardPrec, …) as snake_case, and back for readers of those files.
The map is listed in docs/commands.md ("Files and columns")."""
from __future__ import annotations

import re

import pandas as pd

CSV_SYMBOLS = {"Δ": "delta_", "↑": "_up", "↓": "_down", "/": "_", " ": "_", "%": "pct"}
CSV_BASES = ["All", "mAcc", "Easy", "Medium", "Hard", "Worst", "Worst10", "Std", "Gap", "ΔHard", "ΔEasy", "ΔAll",
             "ΔWorst", "ΔGap", "HardPrec", "HardRate", "Sig↑", "Sig↓", "Top5",
             "BalancedAcc"]  # the table's labels that the CSVs rename


def csv_name(label: str) -> str:
    """The ASCII snake_case CSV name of a table label: Δ → ``delta_``, ↑ / ↓ → ``_up`` / ``_down``, CamelCase →
    snake_case, any other character ``_``, lower case (``ΔHard_ci_lo`` → ``delta_hard_ci_lo``, ``Sig↑`` →
    ``sig_up``, ``HardPrec_sd`` → ``hard_prec_sd``, ``mAcc`` → ``m_acc``, ``Top5`` → ``top5``, ``BalancedAcc`` →
    ``balanced_acc``)."""
    text = re.sub(r"[^A-Za-z0-9_]+", "_", "".join(CSV_SYMBOLS.get(ch, ch) for ch in label))
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text).lower()
    return re.sub(r"_+", "_", text).strip("_")


def csv_labels(df: pd.DataFrame) -> pd.DataFrame:
    """The inverse of :func:`csv_name` on a frame read from one of the CSVs (table.csv, summary.csv): each column
    that starts with the CSV name of a table label (the longest, followed by ``_`` or the end) gets the label back
    (``delta_hard_ci_lo`` → ``ΔHard_ci_lo``); other columns (and frames already in labels) are left as they are."""
    bases = sorted(((csv_name(b), b) for b in CSV_BASES), key=lambda x: -len(x[0]))

    def label(col: str) -> str:
        for name, base in bases:
            if col == name or col.startswith(name + "_"):
                return base + col[len(name):]
        return col

    return df.rename(columns=label)
