#include "forge/plan/cost.h"

#include <algorithm>
#include <limits>

#include "forge/core/error.h"

namespace forge::plan {

CostBreakdown run_cost(const CostInputs& in, double gpu_hours, int64_t gpus, int64_t gpus_per_node, double tdp_w) {
  FORGE_CHECK(in.rent_per_hour >= 0 && in.price_per_gpu >= 0 && in.price_per_server >= 0 && in.power_w >= 0,
              "cost: prices and power must be >= 0");
  FORGE_CHECK(in.pue >= 1, "cost: --pue must be >= 1 (total facility power / IT power), got ", in.pue);
  FORGE_CHECK(in.years > 0, "cost: --years must be > 0, got ", in.years);
  FORGE_CHECK(in.utilisation > 0 && in.utilisation <= 1, "cost: --utilisation must be in (0, 1], got ", in.utilisation);
  CostBreakdown c;
  c.gpu_hours = gpu_hours;
  c.run_hours_per_gpu = gpu_hours / static_cast<double>(std::max<int64_t>(1, gpus));
  c.rent_per_hour = in.rent_per_hour;
  c.rent_known = in.rent_per_hour > 0;
  c.rent_total = gpu_hours * in.rent_per_hour;
  c.power_w = in.power_w > 0 ? in.power_w : 1.5 * tdp_w;
  c.energy_per_gpu_hour = c.power_w / 1000.0 * in.pue * in.electricity;
  c.energy_kwh = gpu_hours * c.power_w / 1000.0 * in.pue;
  c.energy_cost = gpu_hours * c.energy_per_gpu_hour;
  c.capex_per_gpu = in.price_per_gpu > 0 ? in.price_per_gpu
                                         : in.price_per_server / static_cast<double>(std::max<int64_t>(1, gpus_per_node));
  c.buy_known = c.capex_per_gpu > 0;
  c.capex_total = c.capex_per_gpu * static_cast<double>(gpus);
  c.owned_per_gpu_hour = c.capex_per_gpu / (in.years * 8760.0 * in.utilisation) + c.energy_per_gpu_hour;
  c.buy_run_cost = gpu_hours * c.owned_per_gpu_hour;
  const double saving = in.rent_per_hour - c.energy_per_gpu_hour;
  c.break_even_hours = saving > 0 ? c.capex_per_gpu / saving : std::numeric_limits<double>::infinity();
  c.break_even_months = c.break_even_hours / (730.0 * in.utilisation);
  return c;
}

}  // namespace forge::plan
