//go:build race

package offload

// raceDetector tells tests of pure computation that the race detector
// slows them about tenfold (see TestFixedPlanOnMoreResourcesOnG10Traces).
const raceDetector = true
