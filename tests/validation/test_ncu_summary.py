"""The Nsight Compute summaries the docs quote, from small synthetic exports of ncu's two CSV pages."""

import csv

from dsv4kit.validation import ncu_summary

RAW = [["Kernel Name", "Grid Size", "smsp__pcsamp_warps_issue_stalled_barrier",
        "smsp__pcsamp_warps_issue_stalled_barrier_not_issued", "smsp__pcsamp_warps_issue_stalled_wait",
        "smsp__pcsamp_warps_issue_stalled_drain", "dram__bytes"],
       ["", "", "", "", "", "", "byte"],
       ["_kernel", "(64, 1, 2)", "1,200", "1,100", "30", "0", "5"]]
SOURCE = [["Kernel Name", "_kernel"],
          ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_barrier", "stall_wait",
           "stall_barrier (Not Issued)"],
          ["0x0", "  LDC R1, c[0x0][0x28]", "2", "0", "2", "0"],
          ["0x10", "  WARPGROUP.DEPBAR.LE gsb0, 0x0", "90", "88", "2", "88"],
          ["0x20", "  EXIT", "0", "0", "0", "0"]]


def test_stall_reasons_keep_the_non_zero_issue_stalls():
    head, values = ncu_summary.stall_reasons(RAW)
    assert head == ["Kernel Name", "Grid Size", "smsp__pcsamp_warps_issue_stalled_barrier",
                    "smsp__pcsamp_warps_issue_stalled_wait"]
    assert values == ["_kernel", "(64, 1, 2)", "1,200", "30"]


def test_top_stall_sites_in_program_order_with_share_and_reason():
    rows = ncu_summary.top_stall_sites(SOURCE, count=2)
    assert rows == [[0, "LDC R1, c[0x0][0x28]", 2, "0.022", "stall_wait"],
                    [1, "WARPGROUP.DEPBAR.LE gsb0, 0x0", 90, "0.978", "stall_barrier"]]


def test_cli_writes_both_files_and_rejects_bad_input(tmp_path, capsys):
    raw, source = tmp_path / "raw.csv", tmp_path / "source.csv"
    for path, rows in ((raw, RAW), (source, SOURCE)):
        with open(path, "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    assert ncu_summary.main([str(raw), str(source), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out_stall_reasons.csv").read_text().startswith("Kernel Name,")
    assert "WARPGROUP.DEPBAR" in (tmp_path / "out_top_stall_sites.csv").read_text()
    assert ncu_summary.main([str(raw)]) == 2
    assert ncu_summary.main([str(tmp_path / "missing.csv"), str(source), str(tmp_path / "x")]) == 2
    assert "cannot read" in capsys.readouterr().err
