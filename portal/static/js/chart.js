// The calls-and-credits chart (bars per day, a line of credits), drawn as SVG at its box's width: the usage and
// admin views.
import { number } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// A chart is drawn again when its box changes width (a phone turned, a window narrowed, a view drawn while
// hidden): the picture is scaled to its box, and its axis text with it, to a few pixels on a phone.
const chartBoxes = new ResizeObserver((changed) => changed.forEach(({ target }) => {
  const drawn = target.drawnChart;
  if (drawn && target.clientWidth && target.clientWidth !== drawn.width) drawChart(target, ...drawn.args);
}));

export function drawChart(box, totalsLine, perDay, days) {
  box.textContent = "";
  box.drawnChart = { width: box.clientWidth, args: [totalsLine, perDay, days] };
  chartBoxes.observe(box);
  const entries = Array.from(perDay.entries());
  // Drawn at the box's own width (within 320..720) so the axis text stays legible on a phone.
  const W = Math.round(Math.min(720, Math.max(320, box.clientWidth || 720)));
  const H = 240, left = 44, right = 52, top = 12, bottom = 28;
  const plotW = W - left - right, plotH = H - top - bottom;
  const maxCalls = Math.max(1, ...entries.map(([, v]) => v.calls));
  const maxCredits = Math.max(1, ...entries.map(([, v]) => v.credits));
  const totalCalls = entries.reduce((s, [, v]) => s + v.calls, 0);
  const totalCredits = entries.reduce((s, [, v]) => s + v.credits, 0);
  const chart = svg("svg", {
    viewBox: "0 0 " + W + " " + H,
    role: "img",
    "aria-label": "Calls (bars) and credits (line) per day over the last " + days + " days: " +
      totalCalls + " calls, " + totalCredits + " credits in all.",
  });
  chart.append(svg("line", { x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis" }));
  chart.append(svg("text", { x: left - 6, y: top + 10, "text-anchor": "end" }, number.format(maxCalls)));
  chart.append(svg("text", { x: left - 6, y: top + plotH, "text-anchor": "end" }, "0"));
  chart.append(svg("text", { x: left + plotW + 6, y: top + 10 }, number.format(maxCredits)));
  const step = plotW / entries.length;
  const points = [];
  const labelEvery = Math.ceil(entries.length / Math.max(3, Math.min(8, Math.floor(plotW / 52))));
  entries.forEach(([date, v], i) => {
    const h = (v.calls / maxCalls) * plotH;
    const bar = svg("rect", {
      x: (left + i * step + step * 0.15).toFixed(1),
      y: (top + plotH - h).toFixed(1),
      width: Math.max(1, step * 0.7).toFixed(1),
      height: h.toFixed(1),
      class: "bar",
    });
    bar.append(svg("title", {}, date + ": " + v.calls + " calls, " + v.credits + " credits"));
    chart.append(bar);
    const cx = left + i * step + step / 2;
    const cy = top + plotH - (v.credits / maxCredits) * plotH;
    points.push(cx.toFixed(1) + "," + cy.toFixed(1));
    if (entries.length <= 31) chart.append(svg("circle", { cx: cx.toFixed(1), cy: cy.toFixed(1), r: 2.5, class: "dot" }));
    const last = i === entries.length - 1 && i % labelEvery >= labelEvery / 2;
    if (i % labelEvery === 0 || last) {
      chart.append(svg("text", { x: cx.toFixed(1), y: H - 8, "text-anchor": "middle" }, date.slice(5)));
    }
  });
  chart.append(svg("polyline", { points: points.join(" "), class: "line" }));
  box.append(chart);
  totalsLine.textContent = number.format(totalCalls) + " calls and " + number.format(totalCredits) +
    " credits in the last " + days + " days (UTC).";
}
