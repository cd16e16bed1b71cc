// Job page: draw loss and accuracy per round; redraw when the HTMX progress panel reports more rounds.
(function () {
  let chart = null;
  let shown = -1;
  const canvas = () => document.getElementById("curve");

  async function draw() {
    const el = canvas();
    if (!el || typeof Chart === "undefined") return;
    const data = await (await fetch(el.dataset.src, { credentials: "same-origin" })).json();
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
    if (panel && Number(panel.dataset.rounds) !== shown) draw();
  });
})();
