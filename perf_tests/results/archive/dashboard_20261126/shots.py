"""Screenshots of a published dashboard (.asv/html of the current clone): the grid and the
pages issue 35 asks for; prints which machines' series have points on each.

    python perf_tests/results/archive/dashboard_20261126/shots.py OUT_DIR [PAGE ...]

PAGE: a benchmark such as ShardedMatmul.time_device (default: PAGES).
"""
import pathlib
import sys

from kernels.bench import dashboard

PAGES = ["Softmax.time_device", "Softmax.track_gbps", "Softmax.track_roofline",
         "Matmul.time_device", "Matmul.track_tflops", "Matmul.track_roofline",
         "Attention.time_device", "Attention.track_tflops", "Attention.track_roofline"]


def main(out: pathlib.Path, pages: list[str], html: pathlib.Path = pathlib.Path(".asv/html")
         ) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dashboard.render(html, "", out / "grid.png", size=(1400, 1600))
    for page in pages:
        facts = dashboard.graph_facts(dashboard.render(html, f"benchmarks.{page}",
                                                       out / f"{page}.png"))
        machines: dict[str, int] = {}
        for label, points in facts.series:
            machine = label.split(" · ")[0]
            machines[machine] = machines.get(machine, 0) + points
        print(f"{page:28s} drawn={facts.drawn} points per machine: {machines}", flush=True)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:] or PAGES)
