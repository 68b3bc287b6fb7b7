#pragma once
// What a run costs, renting or buying, and when buying starts to pay.
//
//   rent      = GPU-hours * price per GPU-hour
//   energy    = GPU-hours * power per GPU (GPU and its share of the server) * PUE * price per kWh
//   owned     = capex per GPU / (years * 8760 h * utilisation) + energy per hour   (per GPU-hour)
//   buy (run) = GPU-hours * owned: the run's share of the machines over their life
//   break-even: buying (capex + energy) equals renting after capex / (rent - energy per hour)
//               hours of use per GPU; with the given utilisation, in months.
#include <cstdint>

namespace forge::plan {

struct CostInputs {
  double rent_per_hour = 0;     // USD per GPU-hour (0: unknown)
  double price_per_gpu = 0;     // USD (0: unknown)
  double price_per_server = 0;  // USD per server of gpus_per_node GPUs; used when price_per_gpu is 0
  double power_w = 0;           // per GPU including its share of the server (0: 1.5 * TDP)
  double pue = 1.2;             // data-centre power usage effectiveness
  double electricity = 0.12;    // USD per kWh
  double years = 4;             // service life of bought hardware
  double utilisation = 0.8;     // fraction of that life the GPUs are busy
};

struct CostBreakdown {
  bool rent_known = false, buy_known = false;
  double gpu_hours = 0;
  double rent_per_hour = 0;
  double rent_total = 0;
  double capex_per_gpu = 0;
  double capex_total = 0;           // buying the run's GPUs outright
  double power_w = 0;               // per GPU, before PUE
  double energy_kwh = 0;            // of the run
  double energy_cost = 0;           // of the run
  double energy_per_gpu_hour = 0;   // USD
  double owned_per_gpu_hour = 0;    // amortised capex + energy
  double buy_run_cost = 0;          // gpu_hours * owned_per_gpu_hour
  double break_even_hours = 0;      // per GPU; infinite when renting costs no more than power
  double break_even_months = 0;     // at the given utilisation
  double run_hours_per_gpu = 0;     // wall-clock hours of the run
};

// `tdp_w` from the GPU catalogue; `gpus_per_node` converts a server price.
CostBreakdown run_cost(const CostInputs& in, double gpu_hours, int64_t gpus, int64_t gpus_per_node, double tdp_w);

}  // namespace forge::plan
