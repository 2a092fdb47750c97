"""Tests of the benchmark charts: the SVG writer (scripts/bench_charts.py) and the charts of the
sections of docs/benchmarks.md (scripts/bench_section_charts.py).

Run: python3 -m unittest discover -s scripts -p 'test_*.py'
"""
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_charts  # noqa: E402
import bench_section_charts as sections  # noqa: E402
from bench_charts import Bar, Chart, Panel, nice_scale, render, tick_label  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def parse(svg):
    return ET.fromstring(svg)


def by_class(root, tag, name):
    return [element for element in root.iter(SVG + tag) if element.get("class") == name]


def axis(root):
    """(x of zero, pixels per unit) as the tick marks of a one-panel chart say."""
    ticks = [(float(tick.get("data-value")), float(tick.get("x"))) for tick in by_class(root, "text", "tick")]
    (zero_value, zero_x), (last_value, last_x) = ticks[0], ticks[-1]
    assert zero_value == 0
    return zero_x, (last_x - zero_x) / last_value


def whisker_ends(path):
    """(low x, high x) of a whisker path `M low,y H high M ...`."""
    first, horizontal = path.get("d").split()[:2]
    return float(first[1:].split(",")[0]), float(horizontal[1:])


class ScaleTest(unittest.TestCase):
    def test_nice_scale_covers_the_largest_value_with_round_steps(self):
        self.assertEqual(nice_scale(10), (10, 2))
        self.assertEqual(nice_scale(7.3), (8, 2))
        self.assertAlmostEqual(nice_scale(0.93)[0], 1.0)
        self.assertEqual(nice_scale(873), (1000, 200))
        self.assertEqual(nice_scale(101), (125, 25))
        self.assertEqual(nice_scale(0), (1.0, 0.2))
        for largest in (0.013, 0.93, 1, 3.1, 62.2, 99.9, 390_166, 9_856_760):
            top, step = nice_scale(largest)
            self.assertGreaterEqual(top, largest)
            self.assertLess(top - step, largest, f"an empty last tick for {largest}")
            self.assertLessEqual(top / step, 6)

    def test_tick_labels_have_the_decimals_the_step_needs(self):
        self.assertEqual(tick_label(25, 25), "25")
        self.assertEqual(tick_label(0.25, 0.25), "0.25")
        self.assertEqual(tick_label(7.5, 2.5), "7.5")
        self.assertEqual(tick_label(1000, 200), "1,000")
        self.assertEqual(tick_label(0.4, 0.2), "0.4")

    def test_bars_whiskers_and_target_sit_on_the_ticks_scale(self):
        bars = [Bar("a", 1.0), Bar("b", 2.5, 2.0, 3.5), Bar("c", 7.3, 6.1, 7.9, series="baseline")]
        root = parse(render(Chart("t", [Panel("p", "ms", bars, 10, "target 10 ms")])))
        zero, per_unit = axis(root)
        self.assertAlmostEqual(per_unit, bench_charts.PLOT_WIDTH / 10, places=6)
        rects = by_class(root, "rect", "bar")
        self.assertEqual(len(rects), 3)
        for bar, rect in zip(bars, rects):
            self.assertAlmostEqual(float(rect.get("x")), zero, places=2)
            self.assertAlmostEqual(float(rect.get("width")), bar.value * per_unit, places=2)
        whiskers = by_class(root, "path", "whisker")
        self.assertEqual(len(whiskers), 2, "one whisker per bar with a spread")
        for bar, whisker in zip(bars[1:], whiskers):
            low, high = whisker_ends(whisker)
            self.assertAlmostEqual(low, zero + bar.low * per_unit, places=2)
            self.assertAlmostEqual(high, zero + bar.high * per_unit, places=2)
        (target,) = by_class(root, "line", "target")
        self.assertAlmostEqual(float(target.get("x1")), zero + 10 * per_unit, places=2)
        self.assertEqual(target.get("x1"), target.get("x2"))
        self.assertTrue(target.get("stroke-dasharray"), "the target is dashed")
        self.assertEqual([label.text for label in by_class(root, "text", "target-label")], ["target 10 ms"])

    def test_whiskers_and_target_beyond_the_bars_widen_the_axis(self):
        root = parse(render(Chart("t", [Panel("p", "s", [Bar("a", 1.0, 0.5, 3.2)], 5)])))
        ticks = [float(tick.get("data-value")) for tick in by_class(root, "text", "tick")]
        self.assertEqual(max(ticks), 5)
        root = parse(render(Chart("t", [Panel("p", "s", [Bar("a", 1.0, 0.5, 6.2)])])))
        ticks = [float(tick.get("data-value")) for tick in by_class(root, "text", "tick")]
        self.assertEqual(max(ticks), 8)

    def test_each_panel_has_its_own_scale(self):
        chart = Chart("t", [Panel("small", "ns", [Bar("x", 10), Bar("y", 5)]),
                            Panel("large", "instructions", [Bar("x", 1000), Bar("y", 250)])])
        rects = by_class(parse(render(chart)), "rect", "bar")
        widths = [float(rect.get("width")) for rect in rects]
        self.assertAlmostEqual(widths[0], bench_charts.PLOT_WIDTH, places=2)
        self.assertAlmostEqual(widths[2], bench_charts.PLOT_WIDTH, places=2)
        self.assertAlmostEqual(widths[1] / widths[0], 0.5, places=4)
        self.assertAlmostEqual(widths[3] / widths[2], 0.25, places=4)


class DocumentTest(unittest.TestCase):
    def test_well_formed_with_one_bar_and_one_value_label_per_value(self):
        chart = Chart("Title <with> & marks", [
            Panel("first", "ms", [Bar("a < b", 1.5), Bar("c & d", 0), Bar("e", 3, 2, 4)], 2),
            Panel("second", "%", [Bar("f", 0.93, text="0.93%"), Bar("g", 0.2)]),
        ], ["a note long enough to be wrapped " * 6])
        root = parse(render(chart))
        self.assertEqual(root.tag, SVG + "svg")
        self.assertEqual(len(by_class(root, "rect", "bar")), 5)
        labels = [element.text for element in by_class(root, "text", "label")]
        self.assertEqual(labels, ["a < b", "c & d", "e", "f", "g"])
        values = [element.text for element in by_class(root, "text", "value")]
        self.assertEqual(values, ["1.50 ms", "0 ms", "3.00 ms", "0.93%", "0.2%"])
        self.assertEqual(root.find(SVG + "title").text, "Title <with> & marks")
        self.assertGreater(len(by_class(root, "text", "note")), 1, "the long note is wrapped")

    def test_everything_fits_inside_the_picture(self):
        chart = Chart("A title", [Panel("p", "M lines/s", [Bar("a rather long label for a bar", 9.9, 1, 12.4)], 1)])
        root = parse(render(chart))
        width = float(root.get("width"))
        for text in root.iter(SVG + "text"):
            x, estimate = float(text.get("x")), bench_charts.text_width(text.text)
            left = {"start": x, "middle": x - estimate / 2, "end": x - estimate}[text.get("text-anchor")]
            self.assertGreaterEqual(left, 0, text.text)
            self.assertLessEqual(left + estimate, width, text.text)

    def test_values_that_cannot_be_drawn_are_refused(self):
        with self.assertRaises(ValueError):
            render(Chart("t", [Panel("p", "ns", [Bar("added", -26)])]))
        with self.assertRaises(ValueError):
            render(Chart("t", [Panel("p", "ns", [Bar("half", 1, low=0.5)])]))
        with self.assertRaises(ValueError):
            render(Chart("t", [Panel("p", "ns", [])]))


PLANNER = """## Planner

| benchmark | time per plan (low / **estimate** / high) |
|---|---|
| plan 1000 replicas on 8 GPUs (pack) | 678 µs / **729 µs** / 781 µs |
| explain 1000 replicas that do not fit on 8 GPUs | 6.16 ms / **6.58 ms** / 7.06 ms |

Reading: fine.
"""

SUPERVISOR = """## Supervisor

| round | tool | lines in files | lines/s | vs gpuvisor | MB/s written | tool CPU (s) | CPU µs per 1000 lines |
|---|---|---|---|---|---|---|---|
| 1 | gpuvisor | 5 | 5,000,000 | 1.00x | 500 | 8.9 | 161 |
| 1 | honcho 2.0 | 1 | 100,000 | 0.02x | 14 | 16.4 | 12280 |
| 2 | gpuvisor | 7 | 7,000,000 | 1.00x | 700 | 7.5 | 110 |
| 2 | honcho 2.0 | 1 | 200,000 | 0.02x | 16 | 11.3 | 7711 |

**Start-up.** `gpuvisor run` of 256 CPU-only replicas, 3 runs: 437 ms, 1,016 ms, 391 ms (median 437 ms).
"""


class SectionTest(unittest.TestCase):
    def test_planner_bars_are_the_table_estimates_with_criterion_intervals(self):
        chart = sections.planner_chart(PLANNER)
        (panel,) = chart.panels
        self.assertEqual(panel.target, 10)
        self.assertEqual([bar.label for bar in panel.bars],
                         ["plan 1000 replicas on 8 GPUs (pack)", "explain 1000 replicas that do not fit on 8 GPUs"])
        for bar, (value, low, high) in zip(panel.bars, [(0.729, 0.678, 0.781), (6.58, 6.16, 7.06)]):
            self.assertAlmostEqual(bar.value, value)
            self.assertAlmostEqual(bar.low, low)
            self.assertAlmostEqual(bar.high, high)
        self.assertEqual(panel.bars[0].text, "729 µs")

    def test_supervisor_bars_are_means_over_rounds_with_min_max_and_start_up_median(self):
        throughput, written, startup = sections.supervisor_chart(SUPERVISOR).panels
        self.assertEqual([bar.label for bar in throughput.bars], ["gpuvisor", "honcho 2.0"])
        self.assertEqual([(round(bar.value, 9), round(bar.low, 9), round(bar.high, 9)) for bar in throughput.bars],
                         [(6, 5, 7), (0.15, 0.1, 0.2)])
        self.assertEqual(throughput.target, 1)
        self.assertEqual([bar.series for bar in throughput.bars], ["gpuvisor", "baseline"])
        self.assertEqual([bar.value for bar in written.bars], [600, 15])
        (start,) = startup.bars
        self.assertEqual((start.value, start.low, start.high, startup.target), (437, 391, 1016, 1000))

    def test_a_section_without_what_its_chart_needs_is_an_error(self):
        with self.assertRaises(sections.ChartError):
            sections.planner_chart("## Planner\n\nno table today\n")
        with self.assertRaises(sections.ChartError):
            sections.supervisor_chart(SUPERVISOR.split("**Start-up.**")[0] + "**Start-up.** not measured.")
        with self.assertRaises(sections.ChartError):
            sections.supervisor_chart(SUPERVISOR.replace("MB/s written", "MB/s"))

    def test_embed_goes_after_the_first_table_once(self):
        lines = PLANNER.splitlines()
        link = "[![x](benchmarks/planner.svg)](benchmarks/planner.svg)"
        once = sections.embed("planner", lines, link)
        self.assertEqual(once[once.index(link) - 2], lines[5], "after the table's last row and a blank line")
        self.assertEqual(sections.embed("planner", once, link), once)
        self.assertEqual(sum(line == link for line in once), 1)

    def test_redraw_writes_every_chart_and_embeds_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            doc = Path(tmp) / "benchmarks.md"
            doc.write_text("# Benchmarks\n\nIntro.\n\n" + PLANNER + "\n" + SUPERVISOR)
            written = sections.redraw(doc)
            self.assertEqual([path.name for path in written], ["planner.svg", "supervisor.svg"])
            text = doc.read_text()
            self.assertIn("](benchmarks/planner.svg)", text)
            self.assertIn("](benchmarks/supervisor.svg)", text)
            self.assertEqual(len(by_class(parse(written[0].read_text()), "rect", "bar")), 2)
            sections.redraw(doc)
            self.assertEqual(doc.read_text(), text, "redrawing twice changes nothing")

    def test_a_full_run_keeps_its_tables_when_a_chart_cannot_be_drawn(self):
        import bench
        from unittest import mock

        good = PLANNER.splitlines()
        broken = ["## Supervisor", "", "The table went missing."]
        sections_run = {"planner": lambda args: good, "supervisor": lambda args: broken}
        with tempfile.TemporaryDirectory() as tmp:
            doc = Path(tmp) / "benchmarks.md"
            argv = ["bench.py", "--only", "planner", "supervisor", "--output", str(doc)]
            with mock.patch.object(bench, "SECTIONS", sections_run), mock.patch.object(sys, "argv", argv), \
                    mock.patch.object(bench, "sh", return_value=mock.Mock(stdout="rustc 1.0")):
                with self.assertRaises(SystemExit) as exit:
                    bench.main()
            self.assertIn("no chart for supervisor", str(exit.exception))
            text = doc.read_text()
            self.assertIn("| plan 1000 replicas on 8 GPUs (pack) |", text)
            self.assertIn("](benchmarks/planner.svg)", text)
            self.assertIn("The table went missing.", text)
            self.assertTrue((Path(tmp) / "benchmarks" / "planner.svg").is_file())
            self.assertFalse((Path(tmp) / "benchmarks" / "supervisor.svg").exists())

    def test_committed_charts_match_the_committed_tables(self):
        """Every section of docs/benchmarks.md has its chart embedded, and the committed SVG is
        what its table draws now (regenerate with `python3 scripts/bench.py --charts-only`)."""
        _, found = sections.split_sections(DOC.read_text())
        found = dict(found)
        for name, heading in sections.HEADINGS.items():
            with self.subTest(section=name):
                self.assertIn(heading, found)
                text = "\n".join(found[heading])
                self.assertIn(f"(benchmarks/{name}.svg)", text)
                chart = sections.BUILDERS[name](text)
                committed = (DOC.parent / "benchmarks" / f"{name}.svg").read_text()
                self.assertEqual(committed, render(chart))
                rows = sum(len(table) - 1 for table in sections.tables(text))
                self.assertGreaterEqual(sum(len(panel.bars) for panel in chart.panels), min(rows, 2))


if __name__ == "__main__":
    unittest.main()
