// Package fleet runs jobs of a pool on GPU hosts that pull their work.
package fleet
