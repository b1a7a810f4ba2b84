// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./utils/Fixture.sol";
import {ProtocolConfig} from "../src/ProtocolConfig.sol";
import {IChallengeManagerTypes} from "../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigErrors} from "../src/errors/ProtocolConfigErrors.sol";
import {IProtocolConfigTypes} from "../src/types/ProtocolConfigTypes.sol";

/// @dev Issue 31: drawDelayBlocks × block time was never compared with drawPeriod. drawCommittee
///      needs a block after openBlock + drawDelayBlocks (the seed) and reverts after openedAt +
///      drawPeriod. Governance moves drawDelayBlocks from 2 to 200 (inside the accepted [1, 200])
///      under the production drawPeriod of 10 minutes: on a 12 s chain the seed block comes 40
///      minutes after the open, so no challenge can ever be drawn; each ends undrawn and every
///      fraud escapes. Now setParams (and the constructor) refuse drawPeriod <
///      minDrawPeriod(drawDelayBlocks) = 2 · (k + 1) · 12 s with DrawPeriodTooShort.
contract AttackDrawDelayTest is Fixture {
    uint256 internal constant BLOCK_TIME = 12; // Ethereum's slot

    function initialParams() internal pure override returns (IProtocolConfigTypes.Params memory p) {
        p = defaultParams();
        p.drawPeriod = 10 minutes; // the production default (verinfer.chain.structs.default_params)
    }

    /// Blocks come every BLOCK_TIME seconds until the block after `target`.
    function _mineTo(uint256 target) internal {
        if (block.number > target) return;
        uint256 n = target + 1 - block.number;
        vm.roll(target + 1);
        vm.warp(block.timestamp + n * BLOCK_TIME);
    }

    function test_attackDrawDelayPastDrawPeriod_fraudStillSlashed() public {
        IProtocolConfigTypes.Params memory p = initialParams();
        p.drawDelayBlocks = 200;
        try config.setParams(p) {} catch {} // accepted before the fix
        Posted memory fraud = postBatch(OTHER_OUT, 2, 0); // the true output is HONEST_OUT
        uint256 id = open(fraud);
        _mineTo(cm.challenge(id).targetBlock);
        try cm.drawCommittee(id) {} catch {} // DrawPeriodOver before the fix
        if (cm.challenge(id).status == IChallengeManagerTypes.Status.AwaitingDraw) {
            cm.resolve(id); // the deadline is past: ends undrawn
        } else {
            IChallengeManagerTypes.Member[] memory ms = cm.committee(id);
            commitAndReveal(id, ms, allSame(ms.length, HONEST_OUT));
            cm.resolve(id);
        }
        vm.assertEq(
            uint256(cm.challenge(id).status),
            uint256(IChallengeManagerTypes.Status.Slashed),
            "fraud escaped: no committee could be drawn inside drawPeriod"
        );
    }

    function test_setParams_drawDelayPastDrawPeriod_reverts() public {
        IProtocolConfigTypes.Params memory p = initialParams();
        p.drawDelayBlocks = 200;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.DrawPeriodTooShort.selector, uint16(200), uint64(12), 4824, uint64(10 minutes)
            )
        );
        config.setParams(p);
    }

    /// The bound is exact: 10 minutes fit k = 24 (2 · 25 · 12 = 600 s), not k = 25.
    function test_setParams_drawDelayAtBound_succeeds() public {
        vm.assertEq(config.minDrawPeriod(24), 600);
        IProtocolConfigTypes.Params memory p = initialParams();
        p.drawDelayBlocks = 24;
        config.setParams(p);
        vm.assertEq(uint256(config.params().drawDelayBlocks), 24);
        p.drawDelayBlocks = 25;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.DrawPeriodTooShort.selector, uint16(25), uint64(12), 624, uint64(10 minutes)
            )
        );
        config.setParams(p);
        // a longer drawPeriod makes room for the longer delay
        p.drawPeriod = 624;
        config.setParams(p);
        vm.assertEq(uint256(config.params().drawDelayBlocks), 25);
    }

    function test_constructor_drawDelayPastDrawPeriod_reverts() public {
        IProtocolConfigTypes.Params memory p = initialParams();
        p.drawDelayBlocks = 200;
        vm.expectRevert(
            abi.encodeWithSelector(
                IProtocolConfigErrors.DrawPeriodTooShort.selector, uint16(200), uint64(12), 4824, uint64(10 minutes)
            )
        );
        new ProtocolConfig(address(this), p, GOVERNANCE_NOTICE);
    }
}
