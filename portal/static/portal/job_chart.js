// Job page: draw loss and accuracy per round; redraw when the HTMX progress panel reports more rounds.
// The final metric per site and pooled, beside the baseline, as bars (#results-chart, in the panel).
(function () {
  let chart = null;
  let shown = -1;
  let bars = null;
  const canvas = () => document.getElementById("curve");

  function drawResults(r) {
    const el = document.getElementById("results-chart");
    if (!el || !r || bars?.canvas === el) return;
    if (bars) bars.destroy();
    const regression = r.metric === "rmse";
    const datasets = [{ type: "bar", label: regression ? "RMSE" : "Accuracy", data: r.values, backgroundColor: "#0d6efd" }];
    if (r.baseline !== null && r.baseline !== undefined) {
      datasets.push({ type: "line", label: "Baseline", data: r.labels.map(() => r.baseline), borderColor: "#dc3545", borderDash: [6, 4], pointRadius: 0, fill: false });
    }
    bars = new Chart(el, {
      data: { labels: r.labels, datasets },
      options: { animation: false, scales: { y: regression ? { beginAtZero: true } : { min: 0, max: 1 } } },
    });
  }

  async function draw() {
    const el = canvas();
    if (!el || typeof Chart === "undefined") return;
    const data = await (await fetch(el.dataset.src, { credentials: "same-origin" })).json();
    drawResults(data.results);
    const c = data.chart;
    shown = c.round.length;
    const datasets = [
      { label: "Federated test accuracy", data: c.eval_accuracy, yAxisID: "acc", borderColor: "#198754", backgroundColor: "#198754", tension: 0.2 },
      { label: "Test loss", data: c.eval_loss, yAxisID: "loss", borderColor: "#dc3545", backgroundColor: "#dc3545", tension: 0.2 },
      { label: "Train loss", data: c.train_loss, yAxisID: "loss", borderColor: "#0d6efd", backgroundColor: "#0d6efd", borderDash: [4, 3], tension: 0.2 },
    ];
    if (chart) {
      chart.data.labels = c.round;
      chart.data.datasets.forEach((d, i) => (d.data = datasets[i].data));
      chart.update();
      return;
    }
    chart = new Chart(el, {
      type: "line",
      data: { labels: c.round, datasets },
      options: {
        animation: false,
        interaction: { mode: "index", intersect: false },
        scales: {
          x: { title: { display: true, text: "Round" } },
          acc: { position: "left", min: 0, max: 1, title: { display: true, text: "Accuracy" } },
          loss: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "Cross-entropy (nats)" } },
        },
      },
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.body.addEventListener("htmx:afterSwap", (e) => {
    const panel = document.getElementById("progress");
    const results = document.getElementById("results-chart");
    if (panel && (Number(panel.dataset.rounds) !== shown || (results && bars?.canvas !== results))) draw();
  });
})();
