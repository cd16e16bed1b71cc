// The pool calendar: availability (shaded), price and carbon intensity (lines), planned jobs.
document.addEventListener("DOMContentLoaded", async () => {
  const canvas = document.getElementById("pool-calendar");
  if (!canvas) return;
  const data = await (await fetch(canvas.dataset.src)).json();
  const labels = data.hours.map((h) => h.slice(5, 13).replace("T", " ") + "h");
  const maxPrice = Math.max(...data.price, 0.0001);
  const jobs = data.jobs.map((j) => {
    const s = data.hours.findIndex((h) => h >= j.start.slice(0, 13));
    return { ...j, idx: s < 0 ? 0 : s };
  });
  const jobBar = data.hours.map((h, i) =>
    jobs.some((j) => j.start.slice(0, 13) <= h.slice(0, 13) && j.end > h) ? maxPrice * 1.1 : null,
  );
  new Chart(canvas, {
    data: {
      labels,
      datasets: [
        { type: "bar", label: "lent to all", data: data.available.map((a) => (a ? maxPrice * 1.05 : 0)), backgroundColor: "rgba(25,135,84,0.12)", barPercentage: 1, categoryPercentage: 1, yAxisID: "price" },
        { type: "bar", label: "lent to other institutions only", data: data.foreign_only.map((a) => (a ? maxPrice * 1.05 : 0)), backgroundColor: "rgba(13,110,253,0.15)", barPercentage: 1, categoryPercentage: 1, yAxisID: "price" },
        { type: "line", label: `price (${data.currency} per SU·h)`, data: data.price, borderColor: "#b35c00", pointRadius: 0, stepped: true, yAxisID: "price" },
        { type: "line", label: "carbon (gCO2e/kWh)", data: data.carbon, borderColor: "#495057", pointRadius: 0, yAxisID: "carbon" },
        { type: "line", label: "jobs", data: jobBar, borderColor: "#6f42c1", backgroundColor: "#6f42c1", borderWidth: 6, pointRadius: 5, pointStyle: "rect", spanGaps: false, yAxisID: "price" },
      ],
    },
    options: {
      animation: false,
      interaction: { mode: "index", intersect: false },
      scales: {
        x: { ticks: { maxTicksLimit: 14 }, stacked: true },
        price: { position: "left", beginAtZero: true, title: { display: true, text: data.currency } },
        carbon: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "gCO2e/kWh" } },
      },
    },
  });
  const list = document.getElementById("planned");
  if (!data.jobs.length) list.innerHTML = '<li class="list-group-item text-secondary">No job planned in these days.</li>';
  for (const j of data.jobs) {
    const li = document.createElement("li");
    li.className = "list-group-item";
    const a = document.createElement("a");
    a.href = `/jobs/${j.id}/`;
    a.textContent = `#${j.id} ${j.title}`;
    li.append(a, ` — ${j.status}, ${j.start.slice(0, 16).replace("T", " ")} → ${j.end.slice(11, 16)} UTC`);
    list.append(li);
  }
});
