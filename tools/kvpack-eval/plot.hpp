// kvpack-eval --plot: quality vs measured bits per value, one panel for mean KL and one for the
// perplexity change, with the Pareto frontier (no other policy has both fewer bits and less loss)
// drawn through the points. Every policy is its own series named in the key outside the panels,
// so no label can overlap another or a point, however close two policies land.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "options.hpp"
#include "stats.hpp"

namespace kvpack_eval {

/// Indices of the points on the Pareto frontier of (x, y), both to be minimised, by ascending x.
[[nodiscard]] inline std::vector<size_t> pareto_front(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<size_t> order(x.size()), front;
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] != x[b] ? x[a] < x[b] : y[a] < y[b]; });
  for (size_t i : order)
    if (front.empty() || y[i] < y[front.back()]) front.push_back(i);
  return front;
}

/// Writes opt.plot (PNG, gnuplot's pngcairo). stats[0] is the fp32 baseline. Errors
/// (Errc::io_error): the data or script files cannot be written, or gnuplot fails.
[[nodiscard]] inline kvpack::Status write_plot(const std::vector<PolicyStats>& stats, const Options& opt,
                                               const std::string& model_name) {
  const PolicyStats& base = stats[0];
  const std::string dat = opt.plot + ".dat", gp = opt.plot + ".gp";
  std::vector<double> bits, kl, dppl;
  for (const auto& s : stats) {
    bits.push_back(s.bits_per_value());
    kl.push_back(std::max(s.kl_mean(), 1e-7));
    dppl.push_back(100 * (s.ppl() / base.ppl() - 1));
  }
  {
    std::ofstream d(dat);
    for (size_t i = 0; i < stats.size(); ++i)
      d << stats[i].name << " " << bits[i] << " " << kl[i] << " " << dppl[i] << "\n";
    d << "\n\n";  // index 1: the KL frontier; index 2: the perplexity frontier
    for (size_t i : pareto_front(bits, kl)) d << stats[i].name << " " << bits[i] << " " << kl[i] << " 0\n";
    d << "\n\n";
    for (size_t i : pareto_front(bits, dppl)) d << stats[i].name << " " << bits[i] << " 0 " << dppl[i] << "\n";
    if (!d) return kvpack::fail(kvpack::Errc::io_error, "cannot write " + dat);
  }
  // One series per policy: point type and colour cycle so that neighbours differ.
  auto series = [&](int col) {
    std::string s;
    for (size_t i = 0; i < stats.size(); ++i)
      s += "'" + dat + "' index 0 every ::" + std::to_string(i) + "::" + std::to_string(i) + " using 2:" +
           std::to_string(col) + " with points pt " + std::to_string(int(i % 6) * 2 + 5) + " ps 1.6 lc " +
           std::to_string(int(i % 8) + 1) + " title '" + stats[i].name + "', ";
    return s;
  };
  {
    std::ofstream g(gp);
    g << "set terminal pngcairo size 1400,560 font ',10' noenhanced\nset output '" << opt.plot << "'\n"
      << "set multiplot layout 1,2 title '" << model_name << ": KV-cache policies, chunk " << opt.chunk
      << " (dashed: Pareto frontier)'\n"
      << "set xlabel 'bits per value (measured, metadata included)'\nset grid\nset key outside right top box\n"
      << "set offsets graph 0.04, graph 0.04, graph 0.06, graph 0.06\n"
      << "set logscale y\nset format y '%.0e'\nset ylabel 'mean KL(fp32 || policy), nats/token (0 drawn at 1e-7)'\n"
      << "plot " << series(3) << "'" << dat << "' index 1 using 2:3 with lines dt 2 lc 'gray40' notitle\n"
      << "unset logscale y\nset format y '%g'\nset ylabel 'perplexity change, %'\n"
      << "plot " << series(4) << "'" << dat << "' index 2 using 2:4 with lines dt 2 lc 'gray40' notitle\n"
      << "unset multiplot\n";
    if (!g) return kvpack::fail(kvpack::Errc::io_error, "cannot write " + gp);
  }
  if (std::system(("gnuplot '" + gp + "'").c_str()) != 0)
    return kvpack::fail(kvpack::Errc::io_error, "gnuplot failed on " + gp);
  std::remove(dat.c_str());
  std::remove(gp.c_str());
  return {};
}

}  // namespace kvpack_eval
