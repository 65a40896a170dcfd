"""Screenshots of a published dashboard (.asv/html of the current clone): the grid and the
pages issue 35 asks for; prints which machines' series have points on each."""
import sys, pathlib
from kernels.bench import dashboard

out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
html = pathlib.Path(".asv/html")
pages = ["Softmax.time_device", "Softmax.track_gbps", "Softmax.track_roofline",
         "Matmul.time_device", "Matmul.track_tflops", "Matmul.track_roofline",
         "Attention.time_device", "Attention.track_tflops", "Attention.track_roofline"]
dashboard.render(html, "", out / "grid.png", size=(1400, 1600))
for page in pages:
    dom = dashboard.render(html, f"benchmarks.{page}", out / f"{page}.png")
    facts = dashboard.graph_facts(dom)
    machines = {}
    for label, points in facts.series:
        machines.setdefault(label.split(" · ")[0], 0)
        machines[label.split(" · ")[0]] += points
    print(f"{page:28s} drawn={facts.drawn} points per machine: {machines}", flush=True)
