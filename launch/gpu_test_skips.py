#!/usr/bin/env python3
"""Did the GPU tests pass, with a GPU present? From ctest's JUnit file (ctest --output-junit; gtest's own
--gtest_output=xml files are read too): every test case passed, failed or skipped, and whether a skip is
the expected one. With a GPU present no GPU test may skip, except the tests that cover machines without
a GPU, whose reason starts "a CUDA device is present".

  python3 launch/gpu_test_skips.py JUNIT [--json OUT]     (launch/gpu_check.sh: gpu_report.py skips)

Prints the counts and every failed or skipped test with its reason; writes the summary as JSON to OUT;
exit 1 when a test failed, skipped unexpectedly, or none ran (or the file cannot be read), else 0.
A skip is found three ways, so none slips through: a <skipped> element or status notrun/disabled
(ctest, gtest), result="skipped" (gtest), or gtest's "[  SKIPPED ]" line in the test's output (a skip
ctest reported as a pass).
"""

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET

# The skip reason of the tests that cover machines without a GPU (tests/gpu/gpu_device_test.cpp,
# tests/unit/device_test.cpp): the one skip a GPU machine expects.
EXPECTED_SKIP_PREFIX = "a CUDA device is present"


def _skip_reason(case, output):
    """The reason gtest printed for a skip ("<file>:<line>: Skipped" then the message), else the
    JUnit <skipped message>, else the last line of the output."""
    m = re.search(r": Skipped\n(.*?)\n\[  SKIPPED \]", output, re.S)
    if m and m.group(1).strip():
        return m.group(1).strip()
    skipped = case.find("skipped")
    if skipped is not None:
        msg = (skipped.get("message") or skipped.text or "").strip()
        if msg and msg != "SKIP_REGULAR_EXPRESSION_MATCHED":
            return msg
    lines = [l for l in output.splitlines() if l.strip()]
    return lines[-1].strip() if lines else "(no output)"


def classify_junit(path):
    """Every test case of a JUnit file as passed, failed or skipped, and whether a skip is expected."""
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        name = case.get("name") or "?"
        cls = case.get("classname") or ""
        if cls and cls != name and not name.startswith(cls + "."):
            name = cls + "." + name
        output = "".join((e.text or "") for e in case if e.tag in ("system-out", "system-err"))
        status = (case.get("status") or "").lower()
        result = (case.get("result") or "").lower()
        if case.find("failure") is not None or case.find("error") is not None or status == "fail":
            outcome = "failed"
        elif (
            case.find("skipped") is not None
            or status in ("notrun", "disabled")
            or result in ("skipped", "suppressed")
            or re.search(r"^\[  SKIPPED \]", output, re.M)
        ):
            outcome = "skipped"
        else:
            outcome = "passed"
        entry = {"name": name, "outcome": outcome}
        if outcome == "skipped":
            entry["reason"] = _skip_reason(case, output)
            entry["expected"] = entry["reason"].startswith(EXPECTED_SKIP_PREFIX)
        elif outcome == "failed":
            lines = [l for l in output.splitlines() if "Failure" in l or "error" in l.lower()]
            entry["reason"] = lines[0].strip() if lines else "failed"
        cases.append(entry)
    return cases


def summarize_tests(cases):
    s = {
        "total": len(cases),
        "passed": sum(c["outcome"] == "passed" for c in cases),
        "failed": [c for c in cases if c["outcome"] == "failed"],
        "skipped_expected": [c for c in cases if c["outcome"] == "skipped" and c["expected"]],
        "skipped_unexpected": [c for c in cases if c["outcome"] == "skipped" and not c["expected"]],
    }
    s["ok"] = s["total"] > 0 and not s["failed"] and not s["skipped_unexpected"]
    return s


def cmd_skips(a):
    """`gpu_report.py skips JUNIT [--json OUT]` (and this file run as a script)."""
    try:
        summary = summarize_tests(classify_junit(a.junit))
    except (OSError, ET.ParseError) as e:
        summary = {
            "total": 0,
            "passed": 0,
            "failed": [],
            "skipped_expected": [],
            "skipped_unexpected": [],
            "ok": False,
            "error": f"cannot read {a.junit}: {e}",
        }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(
        f"GPU tests: {summary['total']} run, {summary['passed']} passed, {len(summary['failed'])} failed, "
        f"{len(summary['skipped_unexpected'])} skipped although a GPU is present, "
        f"{len(summary['skipped_expected'])} skipped as expected (they cover machines without a GPU)"
    )
    if summary.get("error"):
        print("error:", summary["error"], file=sys.stderr)
    elif summary["total"] == 0:
        print("error: no GPU test ran (is this a build with tests?)", file=sys.stderr)
    for c in summary["failed"]:
        print(f"  FAILED  {c['name']}: {c['reason']}")
    for c in summary["skipped_unexpected"]:
        print(f"  SKIPPED {c['name']}: {c['reason']}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit")
    ap.add_argument("--json")
    sys.exit(cmd_skips(ap.parse_args()))
