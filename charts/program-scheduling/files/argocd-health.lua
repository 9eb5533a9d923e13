-- Argo CD health for scheduling.program-router.dev/ProgramScheduling (Lua 5.1, as gopher-lua runs it).
-- Progressing: the operator has not reported on the current generation, Ready is absent/Unknown,
--              or Ready=False for a reason that resolves by itself (a rollout in progress).
-- Healthy:     Ready=True.
-- Suspended:   Ready=False because router.replicas is 0 (scaled to zero on purpose).
-- Degraded:    Ready=False for a failure reason (bad spec, no workers, no healthy backends...).
local hs = {}
local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for program-operator to report status"
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for program-operator to observe generation " .. tostring(generation)
  return hs
end
local ready = nil
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Ready" then
      ready = c
    end
  end
end
if ready == nil or ready.status == "Unknown" then
  hs.status = "Progressing"
  if ready ~= nil and ready.message ~= nil then
    hs.message = ready.message
  else
    hs.message = "Ready is not reported yet"
  end
  return hs
end
local message = ready.message or ""
if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = message
  return hs
end
local settling = {
  NotRendered = true,
  NoRouters = true,
  Pending = true,
  StatusUnreachable = true,
  Unavailable = true,
}
if ready.reason == "ScaledToZero" then
  hs.status = "Suspended"
elseif settling[ready.reason] then
  hs.status = "Progressing"
else
  hs.status = "Degraded"
end
hs.message = (ready.reason or "NotReady") .. ": " .. message
return hs
