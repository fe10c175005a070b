"""gateway.store.space's measure of the file system: the share in use is df's Use%."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

from gateway.store.space import Usage, measure


def test_used_ratio_leaves_roots_reserve_out_as_df_does() -> None:
    # 100 blocks, 80 in use, 10 for us, 10 reserved for root: df says 89%, not 90%
    usage = Usage(total=100, free=10, db_bytes=0, wal_bytes=0, used=80)
    assert usage.used_ratio == 80 / 90
    assert Usage(total=0, free=0, db_bytes=0, wal_bytes=0, used=0).used_ratio == 0.0


def test_measure_agrees_with_df(tmp_path: Path) -> None:
    out = subprocess.run(["df", "--output=pcent", str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout.split()
    df_percent = int(out[-1].rstrip("%"))
    ratio = measure(tmp_path, tmp_path / "gateway.db").used_ratio
    # df rounds up; other writers may move the figure by a block between the two reads
    assert abs(math.ceil(ratio * 100) - df_percent) <= 1, (ratio, df_percent)
