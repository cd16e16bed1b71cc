// Institution billing page: usage (core-hours, service units) and money (charges, credits, net) per month.
(function () {
  function draw() {
    const el = document.getElementById("billing-series");
    if (!el || typeof Chart === "undefined") return;
    const s = JSON.parse(el.textContent);
    const cur = s.currency || "";
    new Chart(document.getElementById("usage-chart"), {
      data: {
        labels: s.labels,
        datasets: [
          { type: "bar", label: "Core-hours used", data: s.core_hours_used, yAxisID: "hours", backgroundColor: "#1f4e79" },
          { type: "bar", label: "Core-hours provided", data: s.core_hours_provided, yAxisID: "hours", backgroundColor: "#7fd1ae" },
          { type: "line", label: "SU used", data: s.su_used, yAxisID: "su", borderColor: "#0d6efd", backgroundColor: "#0d6efd", tension: 0 },
          { type: "line", label: "SU provided", data: s.su_provided, yAxisID: "su", borderColor: "#198754", backgroundColor: "#198754", borderDash: [4, 3], tension: 0 },
        ],
      },
      options: {
        animation: false,
        interaction: { mode: "index", intersect: false },
        scales: {
          hours: { position: "left", beginAtZero: true, title: { display: true, text: "Core-hours" } },
          su: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "Service units (SU)" } },
        },
      },
    });
    new Chart(document.getElementById("money-chart"), {
      data: {
        labels: s.labels,
        datasets: [
          { type: "bar", label: "Charges", data: s.charges, backgroundColor: "#dc3545" },
          { type: "bar", label: "Credits", data: s.credits, backgroundColor: "#198754" },
          { type: "line", label: "Net (charges − credits)", data: s.net, borderColor: "#16324f", backgroundColor: "#16324f", tension: 0 },
        ],
      },
      options: {
        animation: false,
        interaction: { mode: "index", intersect: false },
        scales: { y: { title: { display: true, text: cur } } },
        plugins: { tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${c.parsed.y.toFixed(2)} ${cur}` } } },
      },
    });
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
