package pgqueue

// MigrationCount returns the number of embedded migrations.
func MigrationCount() int {
	ms, err := loadMigrations()
	if err != nil {
		panic(err)
	}
	return len(ms)
}

// Channel returns the driver's LISTEN/NOTIFY channel.
func (d *Driver) Channel() string { return d.channel }
