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

// DropNotifications makes the listener lose (or stop losing) every
// notification, as behind a transaction-mode pooler.
func (d *Driver) DropNotifications(drop bool) { d.dropNotes.Store(drop) }
